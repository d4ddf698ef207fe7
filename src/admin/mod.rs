//! The live admin endpoint (feature "admin", Unix only): a Unix socket
//! beside the data, served by the process that holds the store, so an
//! operator's `dedupkv` command reads (and, when allowed, works) a store
//! while its consumer runs. Opt in per store with
//! [`StoreBuilder::admin_socket`](crate::StoreBuilder::admin_socket), or
//! once for a whole `PartitionSet` with `AdminServer::partitions`
//! (feature "replica" too). Without it there is no thread and no
//! socket.
//!
//! **Protocol.** One request per connection: one JSON object on one line
//! (at most [`AdminOptions::max_request_bytes`]), answered by one JSON
//! object on one line, `{"ok": VALUE}` or `{"error": MESSAGE, "kind":
//! KIND}` (`bad_request`, `not_found`, `refused`, `not_assigned`,
//! `failed`). `op` is one of `get` (`scope`, `id`), `stats`, `keys`
//! (`scope`, `state`, `older_than` such as `"7d"`, `limit`),
//! `dead_letters`, `held`,
//! `intents_pending`, `stranded` (the listing filters), and the writes
//! `requeue`, `resolve` (`completed` or `abandon`), `release`, `evict`,
//! `compact`, `upgrade`, refused unless [`AdminOptions::allow_writes`].
//! `get` takes `"history": true` for every record of the key still in
//! the store ([`Store::history`](crate::Store::history)). A partition set's
//! endpoint takes `partition` (a number) or `store` (a partition's file
//! path) with each request, and `"all": true` on a `get` to search every
//! assigned partition (the answer names the one that holds the key).
//! docs/cli.md has the details and the security model.
//!
//! ```
//! use dedupkv::admin::AdminOptions;
//! use dedupkv::{Key, Store};
//! use std::io::{BufRead, BufReader, Write};
//! use std::os::unix::net::UnixStream;
//! # let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("s.redb");
//! let store = Store::builder().admin_socket(AdminOptions::new()).open(&path)?;
//! store.insert_if_absent(&Key::new("orders", "4711"))?;
//!
//! // What `dedupkv get` does beside the running process.
//! let mut conn = UnixStream::connect(dedupkv::admin::socket_path(&path))?;
//! conn.write_all(b"{\"op\":\"get\",\"scope\":\"orders\",\"id\":\"4711\"}\n")?;
//! let mut answer = String::new();
//! BufReader::new(conn).read_line(&mut answer)?;
//! assert!(answer.contains("\"state\":\"Inserted\""));
//! drop(store); // the socket goes with the store
//! assert!(!dedupkv::admin::socket_path(&path).exists());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod json;
mod ops;
mod server;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Result, Store};

/// The default request size limit: 64 KiB.
const MAX_REQUEST: usize = 64 << 10;

/// How a store's (or a partition set's) admin endpoint is served.
///
/// # Examples
/// ```
/// use dedupkv::admin::AdminOptions;
/// # let dir = tempfile::tempdir().unwrap();
/// let store = dedupkv::Store::builder()
///     .admin_socket(AdminOptions::new().allow_writes(true))
///     .open(dir.path().join("s.redb"))?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct AdminOptions {
    path: Option<PathBuf>,
    writes: bool,
    max_request: usize,
}

impl Default for AdminOptions {
    fn default() -> Self {
        AdminOptions::new()
    }
}

impl AdminOptions {
    /// Reads only, at the default path, requests up to 64 KiB.
    ///
    /// # Examples
    /// See [`AdminOptions`].
    pub fn new() -> AdminOptions {
        AdminOptions {
            path: None,
            writes: false,
            max_request: MAX_REQUEST,
        }
    }

    /// Where the socket is bound. Its directory must not be writable by
    /// group or others. Default: beside the store, [`socket_path`] (for a
    /// partition set, [`set_socket_path`]), where the command line looks.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::admin::AdminOptions;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let opts = AdminOptions::new().path(dir.path().join("ops.sock"));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn path(mut self, path: impl Into<PathBuf>) -> AdminOptions {
        self.path = Some(path.into());
        self
    }

    /// Whether the operator writes (`requeue`, `resolve`, `release`,
    /// `evict`, `compact`, `upgrade`) are served. Default: `false` (they are refused with a
    /// message naming this setting).
    ///
    /// # Examples
    /// See [`AdminOptions`].
    pub fn allow_writes(mut self, on: bool) -> AdminOptions {
        self.writes = on;
        self
    }

    /// The longest request served, in bytes; a longer one is answered
    /// with an error. Default: 65,536.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::admin::AdminOptions;
    /// let opts = AdminOptions::new().max_request_bytes(4096);
    /// ```
    pub fn max_request_bytes(mut self, n: usize) -> AdminOptions {
        self.max_request = n;
        self
    }
}

/// Where the endpoint of the store at `store` listens by default:
/// `STORE.admin.sock` beside it.
///
/// # Examples
/// ```
/// let p = dedupkv::admin::socket_path("/var/lib/app/dedup.redb");
/// assert_eq!(p, std::path::Path::new("/var/lib/app/dedup.redb.admin.sock"));
/// ```
pub fn socket_path(store: impl AsRef<Path>) -> PathBuf {
    let mut s = store.as_ref().as_os_str().to_owned();
    s.push(".admin.sock");
    PathBuf::from(s)
}

/// Where a partition set's endpoint listens by default: `BASE/admin.sock`.
///
/// # Examples
/// ```
/// let p = dedupkv::admin::set_socket_path("/var/lib/orders");
/// assert_eq!(p, std::path::Path::new("/var/lib/orders/admin.sock"));
/// ```
pub fn set_socket_path(base: impl AsRef<Path>) -> PathBuf {
    base.as_ref().join("admin.sock")
}

/// Answers one request line of the protocol (see the [module](self)) on
/// `store`, kept at `path`, in this process: what the endpoint answers,
/// without a socket. The command line's offline reads use it, so they
/// print what the endpoint would. Writes run only with `writes`.
///
/// # Examples
/// ```
/// use dedupkv::{Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("s.redb");
/// let store = Store::open(&path)?;
/// let answer = dedupkv::admin::answer(&store, &path, r#"{"op":"stats"}"#, false);
/// assert!(answer.starts_with(r#"{"ok":"#));
/// let refused = dedupkv::admin::answer(&store, &path, r#"{"op":"evict"}"#, false);
/// assert!(refused.contains("allow_writes"));
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn answer(store: &Store, path: &Path, request: &str, writes: bool) -> String {
    let outcome = serde_json::from_str::<Value>(request)
        .map_err(|e| ops::Refusal::bad(format!("the request is not JSON: {e}")))
        .and_then(|r| ops::run(store, path, &r, writes));
    ops::answer_of(outcome).to_string()
}

/// A running admin endpoint; dropping it stops its thread and removes its
/// socket. A store's endpoint lives inside the store (see
/// [`StoreBuilder::admin_socket`](crate::StoreBuilder::admin_socket));
/// a partition set's is this handle (`AdminServer::partitions`, feature
/// "replica" too).
pub struct AdminServer {
    running: server::Running,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("path", &self.running.path())
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// Serves `store`, kept at `path`, until dropped (the builder's way).
    pub(crate) fn store(store: Store, path: &Path, opts: &AdminOptions) -> Result<AdminServer> {
        let socket = opts.path.clone().unwrap_or_else(|| socket_path(path));
        let (path, writes) = (path.to_path_buf(), opts.writes);
        let answer = move |r: &Value| ops::run(&store, &path, r, writes);
        let running = server::start(&socket, opts.max_request, Box::new(answer))?;
        Ok(AdminServer { running })
    }

    /// The socket's path.
    ///
    /// # Examples
    /// See `AdminServer::partitions` (feature "replica").
    pub fn path(&self) -> &Path {
        self.running.path()
    }
}

#[cfg(feature = "replica")]
mod set;
