//! The endpoint's socket and thread: bind beside the data (checked), serve
//! one request per connection, remove the socket on shutdown.
//!
//! Invariants:
//! - the socket is bound only in a directory of this process's user (or
//!   root) that no group or other user may write to, and is mode 0600 before any connection is served (one
//!   made before the `chmod` is dropped unanswered);
//! - an existing socket file is replaced only when nothing answers on it
//!   (its process is gone); a live one, or any other file, is an error;
//! - one request per connection, at most `max_request_bytes`, read
//!   within one deadline for the whole request, each write of the answer
//!   with a timeout: no client stalls the server for long, and
//!   no request, however malformed, ends it;
//! - on shutdown the socket file is removed if it is still the one bound.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::ops::{self, Refusal};
use crate::{Error, Result};

/// How often the idle server looks whether it should stop.
const POLL: Duration = Duration::from_millis(25);
/// How long a client may take to send its request or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the server answers from: one request to one answer.
pub(crate) type Answer = dyn Fn(&Value) -> std::result::Result<Value, Refusal> + Send;

/// A running endpoint; dropping it stops the thread and removes the
/// socket.
pub(crate) struct Running {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An I/O error naming what failed where.
fn io(kind: std::io::ErrorKind, msg: String) -> Error {
    Error::Io {
        what: "starting the admin endpoint",
        source: std::io::Error::new(kind, msg),
    }
}

/// Binds `path` (checked) and serves `answer` on a thread of its own.
pub(crate) fn start(path: &Path, max_request: usize, answer: Box<Answer>) -> Result<Running> {
    let listener = bind(path)?;
    let id = std::fs::symlink_metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| io(e.kind(), format!("{}: {e}", path.display())))?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("dedupkv-admin".into())
            .spawn(move || {
                serve(&listener, &stop, max_request, &*answer);
                // Only the socket this server bound, not one bound since.
                if std::fs::symlink_metadata(&path).is_ok_and(|m| (m.dev(), m.ino()) == id) {
                    let _ = std::fs::remove_file(&path);
                }
            })
            .map_err(|e| Error::Io {
                what: "starting the admin endpoint's thread",
                source: e,
            })?
    };
    Ok(Running {
        path: path.to_path_buf(),
        stop,
        thread: Some(thread),
    })
}

/// The checks, then the bind: see the module's invariants.
fn bind(path: &Path) -> Result<UnixListener> {
    use std::io::ErrorKind as K;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let named = |e: std::io::Error, p: &Path| io(e.kind(), format!("{}: {e}", p.display()));
    let mode = std::fs::metadata(dir)
        .map_err(|e| named(e, dir))?
        .permissions()
        .mode();
    if mode & 0o022 != 0 {
        return Err(io(
            K::PermissionDenied,
            format!(
                "{}: the directory is writable by group or others (mode {:o}), so another \
                 user could replace the admin socket; refused. Make it owner-only \
                 (chmod go-w) or put the socket elsewhere (AdminOptions::path)",
                dir.display(),
                mode & 0o7777
            ),
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(io(
                    K::AddrInUse,
                    format!(
                        "{}: a live admin endpoint answers there (another process serves \
                         this store); not replaced",
                        path.display()
                    ),
                ));
            }
            // Left by a process that is gone: nothing answers on it.
            std::fs::remove_file(path).map_err(|e| named(e, path))?;
        }
        Ok(_) => {
            return Err(io(
                K::AlreadyExists,
                format!(
                    "{}: exists and is not a socket; not replaced (remove it, or choose \
                     AdminOptions::path)",
                    path.display()
                ),
            ));
        }
        Err(e) if e.kind() == K::NotFound => {}
        Err(e) => return Err(named(e, path)),
    }
    let listener = UnixListener::bind(path).map_err(|e| named(e, path))?;
    let owner_only = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| listener.set_nonblocking(true));
    if let Err(e) = owner_only {
        let _ = std::fs::remove_file(path);
        return Err(named(e, path));
    }
    // The socket is ours (this process's user made it): the directory
    // must be ours too, or root's, else its owner could replace the
    // socket and answer the operator's command line.
    let owners = std::fs::metadata(path).and_then(|s| Ok((s.uid(), std::fs::metadata(dir)?.uid())));
    match owners {
        Ok((ours, theirs)) if theirs == ours || theirs == 0 => {}
        Ok((_, theirs)) => {
            let _ = std::fs::remove_file(path);
            return Err(io(
                K::PermissionDenied,
                format!(
                    "{}: the directory belongs to another user (uid {theirs}), who could \
                     replace the admin socket; refused. Put the socket in a directory of \
                     this user's (AdminOptions::path)",
                    dir.display()
                ),
            ));
        }
        Err(e) => {
            let _ = std::fs::remove_file(path);
            return Err(named(e, dir));
        }
    }
    // Connections made before the chmod are dropped unanswered.
    while listener.accept().is_ok() {}
    Ok(listener)
}

fn serve(listener: &UnixListener, stop: &AtomicBool, max_request: usize, answer: &Answer) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = one(&stream, max_request, answer);
            }
            // Nobody waiting (or the accept failed, say out of file
            // descriptors): look again shortly.
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// Serves one connection: one request line, one answer line.
fn one(stream: &UnixStream, max_request: usize, answer: &Answer) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    // One deadline for the whole request, not each read: a client that
    // trickles a byte at a time cannot hold the one serving thread (and
    // the store's close, which waits for it).
    let deadline = std::time::Instant::now() + CLIENT_TIMEOUT;
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the request took longer than its deadline",
            ));
        }
        stream.set_read_timeout(Some(left))?;
        let n = (&*stream).read(&mut buf)?;
        let got = buf.get(..n).unwrap_or_default();
        if let Some(end) = got.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(got.get(..end).unwrap_or_default());
            break;
        }
        line.extend_from_slice(got);
        if n == 0 || line.len() > max_request {
            break;
        }
    }
    let outcome = if line.len() > max_request {
        Err(Refusal::bad(format!(
            "the request is longer than {max_request} bytes (one JSON object on one line)"
        )))
    } else {
        match serde_json::from_slice::<Value>(&line) {
            Ok(request) => answer(&request),
            Err(e) => Err(Refusal::bad(format!("the request is not JSON: {e}"))),
        }
    };
    let mut out = serde_json::to_vec(&ops::answer_of(outcome)).unwrap_or_default();
    out.push(b'\n');
    let mut stream = stream;
    stream.write_all(&out)?;
    stream.flush()
}
