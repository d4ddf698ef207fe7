//! A key's history: every record of it still in the store, for an
//! operator's "what happened to this key".

use crate::types::Record;
use crate::{Key, Result, Store};

impl Store {
    /// Every record of `key` still in the store, oldest first: each
    /// attempt's claim, release, completion or failure, an inserted or
    /// forgotten key, a dead letter, each as [`get`](Self::get) would have
    /// given it then ([`Record::state`] says which kind of record it is,
    /// [`Record::updated_at`] when it was made, [`Record::token`] the
    /// fencing token of its attempt). The last is the key's latest record
    /// when the key is recorded; records that expired but whose bucket is
    /// not yet evicted are included, evicted ones are gone. Empty when the
    /// store holds no record of the key. The key's intents are not in it
    /// ([`intent`](Self::intent)).
    ///
    /// **Cost**: it scans the log tables (buckets) the key can be in —
    /// every bucket up to the one of its latest record, or every bucket
    /// when the key is not recorded — reading each of their rows, so it
    /// takes time in proportion to the size of the file, not to the
    /// key's records; not for a hot path. It writes nothing and works on
    /// a store opened [read-only](Self::open_read_only). A snapshot bucket
    /// by bucket: a record committed during the scan may be left out.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an
    /// empty scope or id; [`Error::Corrupt`](crate::Error::Corrupt) if a
    /// row is damaged (naming the bucket, the key and the file);
    /// [`Error::Storage`](crate::Error::Storage); [`Error::Poisoned`](crate::Error::Poisoned) after a
    /// failed commit.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Begin, Failure, Fingerprint, Key, State, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path().join("s.redb"))?;
    /// let key = Key::new("payments", "order-4711");
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.fail(&c, Failure::Retryable)?;
    /// let Begin::Started(c) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.complete(&c, b"charged")?;
    ///
    /// let states: Vec<State> = store.history(&key)?.iter().map(|r| r.state()).collect();
    /// assert_eq!(
    ///     states,
    ///     [State::InProgress, State::Retryable, State::InProgress, State::Completed]
    /// );
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn history(&self, key: &Key<'_>) -> Result<Vec<Record>> {
        self.engine_for("history")?.history(key)
    }
}
