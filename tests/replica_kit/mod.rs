//! What the replica tests share: where the replica lives (local files in a
//! temporary directory, or an S3 API when `scripts/with-s3.sh` sets
//! `DEDUPKV_S3_ENDPOINT`), and an object store that fails or slows down on
//! demand.
#![allow(dead_code)]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dedupkv::replica::object_store::path::Path;
use dedupkv::replica::object_store::{
    self, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use futures_util::stream::BoxStream;

/// A place for replicas: a directory (or a prefix of the S3 bucket) of
/// its own, removed when dropped.
pub struct Bucket {
    pub objects: Arc<dyn ObjectStore>,
    /// The local directory, when the replica is in local files.
    pub dir: Option<tempfile::TempDir>,
    /// A prefix unique to this test run.
    pub prefix: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Bucket {
    pub fn new() -> Bucket {
        let prefix = format!(
            "t{}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        if let Some(b) = s3() {
            return Bucket {
                objects: b,
                dir: None,
                prefix,
            };
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let objects = Arc::new(
            object_store::local::LocalFileSystem::new_with_prefix(dir.path()).expect("local"),
        );
        Bucket {
            objects,
            dir: Some(dir),
            prefix,
        }
    }

    /// The local path of object `name` under `store`'s prefix (local
    /// files only).
    pub fn file(&self, store: &str, name: &str) -> Option<std::path::PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.path().join(&self.prefix).join(store).join(name))
    }

    /// A store prefix inside this bucket.
    pub fn at(&self, store: &str) -> String {
        format!("{}/{store}", self.prefix)
    }
}

/// The S3 API's store, when the tests run under `scripts/with-s3.sh`.
#[cfg(feature = "replica-s3")]
fn s3() -> Option<Arc<dyn ObjectStore>> {
    use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
    let endpoint = std::env::var("DEDUPKV_S3_ENDPOINT").ok()?;
    let bucket = std::env::var("DEDUPKV_S3_BUCKET").unwrap_or_else(|_| "dedupkv-test".into());
    let s3 = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .build()
        .expect("the S3 store");
    Some(Arc::new(s3))
}

/// Without the S3 client, an endpoint set is a mistake, not a skip.
#[cfg(not(feature = "replica-s3"))]
fn s3() -> Option<Arc<dyn ObjectStore>> {
    assert!(
        std::env::var_os("DEDUPKV_S3_ENDPOINT").is_none(),
        "DEDUPKV_S3_ENDPOINT is set but the tests were built without --features replica-s3"
    );
    None
}

/// Whether these tests run against the S3 API.
pub fn on_s3() -> bool {
    std::env::var_os("DEDUPKV_S3_ENDPOINT").is_some()
}

/// An object store that forwards to another, failing the next
/// `fail_puts` writes, delaying writes by `delay_ms`, and, while
/// `hold_puts` is set, failing every write (an outage). `lose_responses`
/// writes are performed and then answered with an error (a timeout after
/// the write landed); `fail_lists` listings fail; `stall_ms` delays every
/// call (reads, listings and writes) while set. `writes` names every
/// object written or deleted through it, in order. A `gate` holds the
/// next read of a matching object until the test opens it.
#[derive(Debug)]
pub struct Faulty {
    pub inner: Arc<dyn ObjectStore>,
    pub fail_puts: AtomicU32,
    pub hold_puts: AtomicBool,
    pub delay_ms: AtomicU64,
    pub puts: AtomicU64,
    pub failed: AtomicU64,
    /// Writes that land and are then answered with an error.
    pub lose_responses: AtomicU32,
    /// Listings that fail.
    pub fail_lists: AtomicU32,
    /// Every call waits this long first.
    pub stall_ms: AtomicU64,
    /// The objects written or deleted through this store, in order.
    pub writes: std::sync::Mutex<Vec<String>>,
    /// Calls of any kind (writes, reads, heads, listings) so far.
    pub calls: AtomicU64,
    /// The call with this number (1 for the first, 0: none) fails; a
    /// write fails after it landed when `fail_call_after_write` is set.
    pub fail_call: AtomicU64,
    pub fail_call_after_write: AtomicBool,
    /// A lost response starts an outage (`hold_puts`), so what happens
    /// before the retry is up to the test.
    pub hold_after_lost: AtomicBool,
    /// The next write to an object whose name ends with this lands, then
    /// is answered with an error.
    pub lose_response_to: std::sync::Mutex<Option<String>>,
    /// The next owner object created is taken by a rival an instant
    /// before (a lost race for the epoch).
    pub rival_owner: AtomicBool,
    /// The next read of an object whose name contains the gate's pattern
    /// waits, once, until the gate is opened (see [`Gate`]).
    pub gate: std::sync::Mutex<Option<Gate>>,
}

/// Holds one read back: the read names its object on `reached`, then
/// waits for `open` before it goes on to the store beneath.
#[derive(Debug)]
pub struct Gate {
    pub pattern: String,
    pub reached: std::sync::mpsc::Sender<String>,
    pub open: Arc<tokio::sync::Notify>,
}

impl Gate {
    /// A gate for reads of names containing `pattern`: the receiver hears
    /// the name held, and `notify_one` on the `Notify` lets it go.
    pub fn new(
        pattern: &str,
    ) -> (
        Gate,
        std::sync::mpsc::Receiver<String>,
        Arc<tokio::sync::Notify>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let open = Arc::new(tokio::sync::Notify::new());
        let gate = Gate {
            pattern: pattern.to_string(),
            reached: tx,
            open: Arc::clone(&open),
        };
        (gate, rx, open)
    }
}

impl Faulty {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Faulty> {
        Arc::new(Faulty {
            inner,
            fail_puts: AtomicU32::new(0),
            hold_puts: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            lose_responses: AtomicU32::new(0),
            fail_lists: AtomicU32::new(0),
            stall_ms: AtomicU64::new(0),
            writes: std::sync::Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
            fail_call: AtomicU64::new(0),
            fail_call_after_write: AtomicBool::new(false),
            hold_after_lost: AtomicBool::new(false),
            lose_response_to: std::sync::Mutex::new(None),
            rival_owner: AtomicBool::new(false),
            gate: std::sync::Mutex::new(None),
        })
    }

    /// Takes one from `counter` if it is above zero.
    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Counts a call; whether it is the one to fail.
    fn counted(&self) -> bool {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        n == self.fail_call.load(Ordering::SeqCst)
    }

    fn injected(what: &str, location: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "Faulty",
            source: format!("injected failure {what} {location}").into(),
        }
    }

    async fn stall(&self) {
        let stall = self.stall_ms.load(Ordering::SeqCst);
        if stall > 0 {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        }
    }

    fn wrote(&self, location: &Path) {
        self.writes
            .lock()
            .expect("writes")
            .push(location.as_ref().to_string());
    }

    /// How many objects were written or deleted through this store.
    pub fn written(&self) -> usize {
        self.writes.lock().expect("writes").len()
    }

    fn refuse(&self, location: &Path) -> object_store::Result<()> {
        let fail = self.hold_puts.load(Ordering::SeqCst)
            || self
                .fail_puts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if fail {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(object_store::Error::Generic {
                store: "Faulty",
                source: format!("injected failure writing {location}").into(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Faulty {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        self.stall().await;
        let fail_this = self.counted();
        let after = self.fail_call_after_write.load(Ordering::SeqCst);
        if fail_this && !after {
            return Err(Self::injected("writing", location.as_ref()));
        }
        self.refuse(location)?;
        self.puts.fetch_add(1, Ordering::SeqCst);
        if location.as_ref().contains("/owner/") && self.rival_owner.swap(false, Ordering::SeqCst) {
            self.inner
                .put(location, PutPayload::from_static(b"a rival's owner object"))
                .await?;
        }
        self.wrote(location);
        let done = self.inner.put_opts(location, payload, opts).await?;
        let named = {
            let mut to = self.lose_response_to.lock().expect("lose_response_to");
            let hit = to
                .as_ref()
                .is_some_and(|n| location.as_ref().ends_with(n.as_str()));
            if hit {
                *to = None;
            }
            hit
        };
        if fail_this || named || Self::take(&self.lose_responses) {
            if self.hold_after_lost.load(Ordering::SeqCst) {
                self.hold_puts.store(true, Ordering::SeqCst);
            }
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(object_store::Error::Generic {
                store: "Faulty",
                source: format!("injected lost response after writing {location}").into(),
            });
        }
        Ok(done)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.stall().await;
        self.refuse(location)?;
        self.wrote(location);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.stall().await;
        if self.counted() {
            return Err(Self::injected("reading", location.as_ref()));
        }
        let gate = self
            .gate
            .lock()
            .expect("gate")
            .take_if(|g| location.as_ref().contains(g.pattern.as_str()));
        if let Some(g) = gate {
            let _ = g.reached.send(location.as_ref().to_string());
            g.open.notified().await;
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.writes
            .lock()
            .expect("writes")
            .push("(a delete)".to_string());
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        use futures_util::StreamExt;
        if self.counted() || Self::take(&self.fail_lists) {
            let at = prefix.map(|p| p.as_ref().to_string()).unwrap_or_default();
            return futures_util::stream::once(async move {
                Err(object_store::Error::Generic {
                    store: "Faulty",
                    source: format!("injected failure listing {at}").into(),
                })
            })
            .boxed();
        }
        let stall = self.stall_ms.load(Ordering::SeqCst);
        let inner = self.inner.list(prefix);
        if stall == 0 {
            return inner;
        }
        futures_util::stream::once(async move {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        })
        .flat_map(move |()| futures_util::stream::empty())
        .chain(inner)
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// What a replica test returns.
pub type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The objects of a bucket made by [`Bucket::new`] in another process:
/// local files under `dir`, or the S3 API.
pub fn objects_at(dir: Option<&std::path::Path>) -> Arc<dyn ObjectStore> {
    if let Some(b) = s3() {
        return b;
    }
    let dir = dir.expect("a bucket directory");
    Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).expect("local"))
}
