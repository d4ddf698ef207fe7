//! The one small trait every engine under comparison implements.
//!
//! A [`Contender`] is a configuration (engine + durability setting). For each
//! timed run it opens a fresh, empty [`Instance`]; each worker thread gets its
//! own [`Worker`] handle (a store clone, a connection), made before timing
//! starts and dropped after it ends.

/// Errors from any engine, boxed.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// Result with a boxed engine error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
/// A workload key: 16 random bytes (the scope is the same for every key).
pub type Key16 = [u8; 16];

/// The scope every dedupkv key is recorded under.
pub const SCOPE: &[u8] = b"bench";

/// One engine configuration under test.
pub trait Contender: Send + Sync {
    /// Short id for `--contender` filters and CSV/JSON rows.
    fn id(&self) -> &'static str;
    /// Display name for tables.
    fn name(&self) -> String;
    /// What a crash can lose, in a few words.
    fn durability(&self) -> &'static str;
    /// A fresh, empty instance for one run; `expected_keys` is a sizing hint.
    fn open(&self, expected_keys: usize) -> Result<Box<dyn Instance>>;
    /// The instance another process opened, by its [`Instance::shared_name`],
    /// for workers run as several processes; it is left in place when
    /// dropped (its opener removes it). Default: an error, for engines
    /// whose store one process owns (an embedded file).
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_bench_compare::contender::Contender;
    ///
    /// assert!(dedupkv_bench_compare::memory::Memory.attach("elsewhere").is_err());
    /// ```
    fn attach(&self, name: &str) -> Result<Box<dyn Instance>> {
        Err(format!(
            "{}: one process owns the store; cannot attach to {name:?}",
            self.id()
        )
        .into())
    }
    /// Whether [`attach`](Contender::attach) works: several processes can
    /// run one instance. Default: no.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_bench_compare::contender::Contender;
    ///
    /// assert!(!dedupkv_bench_compare::memory::Memory.shared());
    /// ```
    fn shared(&self) -> bool {
        false
    }
}

/// One open, empty store or database, removed when dropped.
pub trait Instance: Send + Sync {
    /// A handle for one worker thread.
    fn worker(&self) -> Result<Box<dyn Worker>>;
    /// The name other processes attach to it by ([`Contender::attach`]);
    /// `None` for an instance one process owns.
    ///
    /// # Examples
    ///
    /// ```
    /// use dedupkv_bench_compare::contender::Contender;
    ///
    /// let inst = dedupkv_bench_compare::memory::Memory.open(10)?;
    /// assert_eq!(inst.shared_name(), None);
    /// # Ok::<(), dedupkv_bench_compare::contender::Error>(())
    /// ```
    fn shared_name(&self) -> Option<String> {
        None
    }
    /// Makes everything acknowledged durable; timed as part of the run.
    fn finish(&self) -> Result<()> {
        Ok(())
    }
}

/// A per-thread handle.
pub trait Worker: Send {
    /// Inserts every key that is absent, as one durable commit (one key per
    /// commit when `keys.len() == 1`); returns how many keys were new. A key
    /// repeated inside `keys` is new at most once.
    fn insert_batch(&mut self, keys: &[Key16]) -> Result<usize>;
    /// The idempotency round: claim `key` and store `outcome` for it if the
    /// key is new; `true` if it was new.
    fn begin_complete(&mut self, key: &Key16, outcome: &[u8]) -> Result<bool>;
}
