//! Waiting across instances: `begin`, and while another attempt (on any
//! instance) holds the key, wait for it to finish or lapse, woken by the
//! database's `LISTEN`/`NOTIFY`, then `begin` again.
//!
//! A waiter listens on a connection of its own, then marks the row it
//! waits for (`waited`), then begins again (so a finish between its
//! first `begin` and its mark is not missed), and sleeps until a
//! notification for its key, the lease end it was told (a lapse sends
//! nothing), or its timeout. Every statement that ends an attempt
//! (`complete`, `complete_batch`, `fail`, a dropped claim's release) of a
//! marked row notifies [`CHANNEL`] in the same statement, with the schema
//! and key as payload; PostgreSQL delivers it when that statement
//! commits, to every session listening, on every instance. The mark and
//! the finish both update the row, so its lock orders them: the finish
//! sees the mark, or the mark sees the attempt ended (and the `begin`
//! after it sees how). A row stays marked for the attempts after (an
//! extra `NOTIFY` at most); unmarked rows never notify, because
//! PostgreSQL commits notifying transactions one at a time.

use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dedupkv::contract::Write;
use dedupkv::{Began, BeginOptions, Error, Fingerprint, Key, Result};
use postgres::Client;
use postgres::fallible_iterator::FallibleIterator;

use crate::{PgClaim, PgStore, connect, storage};

/// The channel every finish notifies, shared by all schemas (the payload
/// names the schema): a fixed name, so it never meets PostgreSQL's limit
/// on identifier length whatever the schema is called.
pub(crate) const CHANNEL: &str = "dedupkv_done";

/// The SQL text of a notification's payload for the key in columns
/// `scope` and `id` of `schema`: `schema.hex(scope).hex(id)` (at most
/// about 2.6 KB for the largest key, under NOTIFY's 8,000 bytes).
pub(crate) fn payload_sql(schema: &str, scope: &str, id: &str) -> String {
    // The schema name was checked: [a-z0-9_] only, so it is a safe literal.
    format!("'{schema}.' || encode({scope}, 'hex') || '.' || encode({id}, 'hex')")
}

/// [`payload_sql`]'s value for `key`, as the waiter compares it.
fn payload(schema: &str, key: &Key<'_>) -> String {
    let hex = |b: &[u8]| {
        b.iter()
            .fold(String::with_capacity(2 * b.len()), |mut s, x| {
                let _ = write!(s, "{x:02x}");
                s
            })
    };
    format!("{schema}.{}.{}", hex(key.scope()), hex(key.id()))
}

/// Never sleep less than this before asking the database again when the
/// lease end told is already past by this instance's clock (the
/// database's may be behind it).
const MIN_NAP: Duration = Duration::from_millis(5);

/// The contract's wait is this backend's: a `Store` opened on it
/// (`StoreBuilder::open_shared`) waits through `LISTEN`/`NOTIFY` too.
impl dedupkv::contract::Waits for PgStore {
    fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Began<PgClaim>> {
        PgStore::begin_or_wait(self, key, fingerprint, options, timeout)
    }
}

impl PgStore {
    /// [`begin`](Write::begin), but while another attempt — on this
    /// instance or any other on the same schema — holds the key
    /// (`InProgress`), waits at most `timeout` for it instead of answering
    /// at once, then answers as `begin` does:
    ///
    /// - the attempt completed, or failed permanently: `Completed` with
    ///   its record;
    /// - it was released (a retryable failure, or its claim dropped):
    ///   `Started`, this caller's attempt;
    /// - its lease lapsed: `Started`, a takeover (interrupted);
    /// - `timeout` passed first: `InProgress`, as `begin` said.
    ///
    /// Woken by the finishing statement's `NOTIFY`, not by polling: the
    /// only other wake-up is the lease end it was told (a lapse notifies
    /// nobody). The wait holds one connection of its own, outside the
    /// pool, for as long as it waits.
    ///
    /// # Concurrent calls on the same key
    /// As `begin`: of the waiters woken by a release or a lapse, exactly
    /// one gets `Started` (the database decides); the others see its
    /// claim and wait again.
    ///
    /// # Errors
    /// As `begin`; a storage error if the listening connection cannot be
    /// made or breaks.
    ///
    /// # Examples
    /// ```no_run
    /// use dedupkv::contract::{Outcome, Settle, Write};
    /// use dedupkv::{Began, BeginOptions, Fingerprint, Key};
    /// use dedupkv_postgres::PgStore;
    /// use std::time::Duration;
    ///
    /// let url = "host=127.0.0.1 user=postgres dbname=postgres";
    /// let (a, b) = (PgStore::connect(url)?, PgStore::connect(url)?); // two instances
    /// let key = Key::new("shop-42", "charge-7");
    /// let p = a.begin(&key, Fingerprint::NONE, &BeginOptions::new(), None)?;
    /// let Began::Started(claim) = a.tell(p)? else { unreachable!() };
    /// let waiter = std::thread::spawn(move || {
    ///     let key = Key::new("shop-42", "charge-7");
    ///     b.begin_or_wait(&key, Fingerprint::NONE, &BeginOptions::new(), Duration::from_secs(60))
    /// });
    /// a.tell(a.complete(&claim, Outcome::raw(b"ch_1"))?)?;
    /// let Began::Completed(rec) = waiter.join().unwrap()? else { unreachable!() };
    /// assert_eq!(rec.outcome(), Some(&b"ch_1"[..]));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin_or_wait(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        timeout: Duration,
    ) -> Result<Began<PgClaim>> {
        let begin = || {
            self.begin(key, fingerprint, options, None)
                .map(dedupkv::contract::Pending::into_parts)
                .map(|(v, _settled)| v)
        };
        let first = begin()?;
        if !matches!(first, Began::InProgress(_)) {
            return Ok(first);
        }
        let deadline = Instant::now() + timeout;
        let mut listener = connect(&self.shared.url)?;
        listener
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .map_err(storage)?;
        let mine = payload(&self.shared.schema, key);
        let mark = self.shared.sql.0[crate::sql::Q::Waiting as usize].as_str();
        listener
            .execute(mark, &[&key.scope(), &key.id()])
            .map_err(storage)?;
        loop {
            // Again, now listening: a finish before the LISTEN is seen here.
            let info = match begin()? {
                Began::InProgress(info) => info,
                other => return Ok(other),
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(Began::InProgress(info));
            }
            let to_lease_end = info
                .lease_expires_at()
                .duration_since(self.local_now())
                .unwrap_or(Duration::ZERO)
                .max(MIN_NAP);
            let until = deadline.min(now + to_lease_end);
            let notified = wait_for(&mut listener, &mine, until)?;
            if !notified && until == deadline {
                // Timed out with no word of the key: as `begin` said.
                return Ok(Began::InProgress(info));
            }
        }
    }

    /// This instance's reading of the store's time: the test clock if one
    /// was given, else the system's (only to size a nap: every decision
    /// is made on the database's clock).
    fn local_now(&self) -> SystemTime {
        self.shared
            .now()
            .and_then(|ms| u64::try_from(ms).ok())
            .map_or_else(SystemTime::now, |ms| UNIX_EPOCH + Duration::from_millis(ms))
    }
}

/// Sleeps on `listener` until a notification carrying `mine` (`true`),
/// or `until` (`false`).
fn wait_for(listener: &mut Client, mine: &str, until: Instant) -> Result<bool> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let got = listener
            .notifications()
            .timeout_iter(left)
            .next()
            .map_err(storage)?;
        match got {
            Some(n) if n.payload() == mine => return Ok(true),
            Some(_) => {}
            None if listener.is_closed() => {
                return Err(Error::Storage(
                    std::io::Error::other("the LISTEN connection to PostgreSQL closed").into(),
                ));
            }
            None => return Ok(false),
        }
    }
}
