//! What the store knows about a key: [`Record`] and [`State`].

use std::time::SystemTime;

use crate::clock::to_system_time;
use crate::{Fingerprint, Key, Result};

/// The state of a key, as of its latest record.
///
/// # Examples
/// ```
/// # use dedupkv::{Key, State, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// store.insert_if_absent(&Key::new("t", "e1"))?;
/// let rec = store.get(&Key::new("t", "e1"))?.expect("recorded");
/// assert_eq!(rec.state(), State::Inserted);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum State {
    /// Recorded by [`insert_if_absent`](crate::Store::insert_if_absent) or
    /// [`insert_batch`](crate::Store::insert_batch): seen, no outcome.
    Inserted,
    /// Claimed by a worker whose claim is not finished (its lease may have
    /// lapsed; the next `begin` then takes it over).
    InProgress,
    /// The last attempt failed with a retryable error; the next `begin`
    /// starts a new attempt.
    Retryable,
    /// Completed; the outcome is stored.
    Completed,
    /// Failed permanently; the failure payload is stored and replayed.
    Failed,
    /// Forgotten on purpose with [`forget`](crate::Store::forget): the key
    /// is absent to every call, and `get` shows when it was forgotten (its
    /// attempts and fingerprint are those of the record it replaced) until
    /// this record expires.
    Forgotten,
    /// In the dead-letter area: its retries were exhausted
    /// ([`Failure::Exhausted`](crate::Failure::Exhausted)); `outcome` is the
    /// reason. It stays until [`requeue`](crate::Store::requeue),
    /// [`resolve`](crate::Store::resolve) or `forget`, whatever the
    /// retention.
    DeadLettered,
}

/// Everything recorded about one key: what a person needs during an incident,
/// and the outcome a repeat gets back.
///
/// # Examples
/// ```
/// # use dedupkv::{Begin, Fingerprint, Key, State, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("shop-42", "order-7");
/// if let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? {
///     store.complete(&claim, b"shipped")?;
/// }
/// let rec = store.get(&key)?.expect("recorded");
/// assert_eq!(rec.state(), State::Completed);
/// assert_eq!(rec.outcome(), Some(&b"shipped"[..]));
/// assert_eq!(rec.attempts(), 1);
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub(crate) key: Key<'static>,
    pub(crate) state: State,
    pub(crate) attempts: u32,
    pub(crate) token: u64,
    pub(crate) first_seen: u64,
    pub(crate) updated: u64,
    pub(crate) expires: u64,
    pub(crate) lease_until: Option<u64>,
    pub(crate) fingerprint: Option<Fingerprint>,
    /// See [`Record::provider_key`]; `None` for an inserted key.
    pub(crate) provider_key: Option<u128>,
    pub(crate) outcome_tag: u8,
    pub(crate) outcome: Option<Vec<u8>>,
}

impl Record {
    /// A record of `key` in `state`, with no attempts, times, fingerprint
    /// or outcome yet (for a backend of the [contract](crate::contract)
    /// building its answer; the `with_` calls fill the rest in).
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Key, Record, State};
    ///
    /// let rec = Record::new(Key::new("t", "e").into_owned(), State::Completed)
    ///     .with_attempts(2)
    ///     .with_outcome(b"done".to_vec());
    /// assert_eq!((rec.state(), rec.attempts()), (State::Completed, 2));
    /// assert_eq!(rec.outcome(), Some(&b"done"[..]));
    /// ```
    #[must_use]
    pub fn new(key: Key<'static>, state: State) -> Record {
        Record {
            key,
            state,
            attempts: 0,
            token: 0,
            first_seen: 0,
            updated: 0,
            expires: 0,
            lease_until: None,
            fingerprint: None,
            provider_key: None,
            outcome_tag: crate::codec::TAG_RAW,
            outcome: None,
        }
    }

    /// This record with `attempts` attempts.
    ///
    /// # Examples
    /// See [`Record::new`].
    #[must_use]
    pub fn with_attempts(mut self, attempts: u32) -> Record {
        self.attempts = attempts;
        self
    }

    /// This record with the raw outcome `outcome`.
    ///
    /// # Examples
    /// See [`Record::new`].
    #[must_use]
    pub fn with_outcome(mut self, outcome: Vec<u8>) -> Record {
        self.outcome = Some(outcome);
        self
    }

    /// This record with the operation's `fingerprint`.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Fingerprint, Key, Record, State};
    ///
    /// let f = Fingerprint::of("100 EUR");
    /// let rec = Record::new(Key::new("t", "e").into_owned(), State::InProgress).with_fingerprint(f);
    /// assert_eq!(rec.fingerprint(), Some(f));
    /// ```
    #[must_use]
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Record {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// This record with the operation's provider key (as
    /// [`provider_key`](Self::provider_key) shows it, 32 hex digits): for
    /// a backend of the [contract](crate::contract) that derives it from
    /// its stored fields, the same on every instance.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Key, Record, State};
    ///
    /// let rec = Record::new(Key::new("t", "e").into_owned(), State::InProgress).with_provider_key(0xab);
    /// assert_eq!(rec.provider_key().as_deref(), Some("000000000000000000000000000000ab"));
    /// ```
    #[must_use]
    pub fn with_provider_key(mut self, provider_key: u128) -> Record {
        self.provider_key = Some(provider_key);
        self
    }

    /// This record with its times: when the key was first recorded
    /// (its operation's first attempt), when its latest record was
    /// written, and the earliest time it may be evicted.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Key, Record, State};
    /// use std::time::{Duration, UNIX_EPOCH};
    ///
    /// let t = |s| UNIX_EPOCH + Duration::from_secs(s);
    /// let rec = Record::new(Key::new("t", "e").into_owned(), State::Completed).with_times(t(1), t(2), t(9));
    /// assert_eq!((rec.first_seen_at(), rec.updated_at(), rec.expires_at()), (t(1), t(2), t(9)));
    /// ```
    #[must_use]
    pub fn with_times(
        mut self,
        first_seen: SystemTime,
        updated: SystemTime,
        expires: SystemTime,
    ) -> Record {
        self.first_seen = crate::clock::to_ms(first_seen);
        self.updated = crate::clock::to_ms(updated);
        self.expires = crate::clock::to_ms(expires);
        self
    }

    /// The key this record is about.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # store.insert_if_absent(&Key::new("t", "e"))?;
    /// let rec = store.get(&Key::new("t", "e"))?.expect("recorded");
    /// assert_eq!(rec.key(), &Key::new("t", "e"));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn key(&self) -> &Key<'static> {
        &self.key
    }

    /// The key's state.
    ///
    /// # Examples
    /// See [`Record`].
    pub fn state(&self) -> State {
        self.state
    }

    /// Attempts started so far (0 for an inserted key).
    ///
    /// # Examples
    /// See [`Record`].
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The fencing token of the latest attempt (0 for an inserted key).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "e");
    /// if let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? {
    ///     let token = claim.token();
    ///     store.complete(&claim, b"ok")?;
    ///     assert_eq!(store.get(&key)?.expect("recorded").token(), token);
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The provider key of the key's operation, derived from this record:
    /// the one [`Claim::provider_key`](crate::Claim::provider_key) gives
    /// every attempt of it. `None` for a key recorded by
    /// `insert_if_absent`, which is no operation.
    ///
    /// It reports, for reconciling with a provider; it does not hand out.
    /// With an asynchronous replica a record read here may still be in the
    /// replica's lag, where a lost disk would take the operation (and so
    /// this key) with it: send a provider only what `Claim::provider_key`
    /// gave, which waits for the upload.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "e");
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.complete(&claim, b"ok")?;
    /// let rec = store.get(&key)?.expect("recorded");
    /// assert_eq!(rec.provider_key(), Some(claim.provider_key()?));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn provider_key(&self) -> Option<String> {
        self.provider_key.map(|k| format!("{k:032x}"))
    }

    /// When the key was first recorded.
    ///
    /// # Examples
    /// See [`Record::updated_at`].
    pub fn first_seen_at(&self) -> SystemTime {
        to_system_time(self.first_seen)
    }

    /// When the latest record of the key was written.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, ManualClock, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// let store = Store::builder().clock(clock.clone()).open(dir.path().join("s.redb"))?;
    /// store.insert_if_absent(&Key::new("t", "e"))?;
    /// let rec = store.get(&Key::new("t", "e"))?.expect("recorded");
    /// assert_eq!(rec.updated_at(), rec.first_seen_at());
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn updated_at(&self) -> SystemTime {
        to_system_time(self.updated)
    }

    /// The earliest time the record may be evicted; it is kept at least
    /// until then (retention rounds up to the end of a time bucket).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # store.insert_if_absent(&Key::new("t", "e"))?;
    /// let rec = store.get(&Key::new("t", "e"))?.expect("recorded");
    /// assert!(rec.expires_at() > rec.updated_at());
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn expires_at(&self) -> SystemTime {
        to_system_time(self.expires)
    }

    /// When the current claim's lease lapses, for a key in progress.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "e");
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// let rec = store.get(&key)?.expect("recorded");
    /// assert_eq!(rec.lease_expires_at(), Some(claim.lease_expires_at()));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn lease_expires_at(&self) -> Option<SystemTime> {
        self.lease_until.map(to_system_time)
    }

    /// The request fingerprint recorded at `begin` (`None` for a key
    /// recorded by `insert_if_absent`).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "e");
    /// let fp = Fingerprint::of("params");
    /// let _claim = store.begin(&key, fp)?;
    /// assert_eq!(store.get(&key)?.expect("recorded").fingerprint(), Some(fp));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.fingerprint
    }

    /// The stored outcome of a completed key, or the failure payload of a
    /// permanently failed one. `None` in every other state.
    ///
    /// # Examples
    /// See [`Record`].
    pub fn outcome(&self) -> Option<&[u8]> {
        self.outcome.as_deref()
    }

    /// Whether the stored payload is a permanent failure rather than a
    /// successful outcome.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "e");
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.fail(&claim, Failure::Permanent(b"card declined"))?;
    /// let rec = store.get(&key)?.expect("recorded");
    /// assert!(rec.is_failure());
    /// assert_eq!(rec.outcome(), Some(&b"card declined"[..]));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn is_failure(&self) -> bool {
        self.state == State::Failed
    }

    /// Decodes a typed outcome stored with
    /// [`complete_value`](crate::Store::complete_value): CBOR, or JSON (a
    /// value only JSON reads back, and every typed outcome of earlier
    /// builds) or postcard (builds before JSON); the record's format tag
    /// says which.
    ///
    /// # Errors
    /// [`Error::Codec`](crate::Error::Codec) if there is no outcome, it was
    /// stored as raw bytes (by [`complete`](crate::Store::complete)), or it
    /// does not decode as `T`.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, Fingerprint, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "e");
    /// let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// store.complete_value(&claim, &(201u16, "created".to_string()))?;
    /// let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else { unreachable!() };
    /// let (status, body): (u16, String) = rec.outcome_as()?;
    /// assert_eq!(status, 201);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn outcome_as<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        let bytes = self
            .outcome
            .as_deref()
            .ok_or_else(|| crate::Error::Codec("the record has no outcome".into()))?;
        crate::codec::from_bytes(self.outcome_tag, bytes)
    }
}
