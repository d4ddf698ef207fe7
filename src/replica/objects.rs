//! The object store as the replica uses it: blocking calls, each run on
//! the replica's own tokio runtime (two worker threads, shared by every
//! store of the process), so the engine stays synchronous and a caller
//! inside another runtime never blocks one of its workers on ours.
//!
//! Names are relative to the store's prefix: `owner/…`, `seg/…`, `snap/…`.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::{Error, Result};

/// The process's replica runtime.
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dedupkv-replica-io")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::Io {
        what: "starting the replica's runtime",
        source: std::io::Error::other(e.clone()),
    })
}

/// Runs `fut` on the replica's runtime and waits for it.
fn block<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> Result<T> {
    let rt = runtime()?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().map_err(|_| Error::Io {
        what: "waiting for the replica's runtime",
        source: std::io::Error::other("the task was dropped"),
    })
}

/// What a create-only write found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Created {
    /// The object is ours now.
    Created,
    /// An object was there already.
    Exists,
}

/// A replica's object store and prefix.
#[derive(Clone, Debug)]
pub(crate) struct Objects {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

/// The replica error for `what` failing with `e`.
pub(crate) fn failed(what: String, e: object_store::Error) -> Error {
    Error::Replica {
        what,
        source: Box::new(e),
    }
}

impl Objects {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, prefix: Path) -> Objects {
        Objects { store, prefix }
    }

    /// The full name of `name` (for messages and calls).
    pub(crate) fn path(&self, name: &str) -> Path {
        let mut p = self.prefix.clone();
        for part in name.split('/').filter(|part| !part.is_empty()) {
            p = p.clone().join(part);
        }
        p
    }

    /// Starts fetching `name` now; the receiver yields it (or `None`
    /// when it does not exist).
    pub(crate) fn prefetch(
        &self,
        name: &str,
    ) -> Result<std::sync::mpsc::Receiver<std::result::Result<Option<Bytes>, object_store::Error>>>
    {
        let rt = runtime()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (store, path) = (Arc::clone(&self.store), self.path(name));
        rt.spawn(async move {
            let got = match store.get(&path).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            };
            let _ = tx.send(got);
        });
        Ok(rx)
    }

    /// Writes `bytes` at `name` unless an object is there.
    pub(crate) fn create(&self, name: &str, bytes: Vec<u8>) -> Result<Created> {
        let (store, path) = (Arc::clone(&self.store), self.path(name));
        let out = block(async move {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            store.put_opts(&path, PutPayload::from(bytes), opts).await
        })?;
        match out {
            Ok(_) => Ok(Created::Created),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::Exists),
            Err(e) => Err(failed(format!("creating {}", self.path(name)), e)),
        }
    }

    /// Writes `bytes` at `name`, replacing what is there.
    pub(crate) fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let (store, path) = (Arc::clone(&self.store), self.path(name));
        block(async move { store.put(&path, PutPayload::from(bytes)).await })?
            .map(|_| ())
            .map_err(|e| failed(format!("writing {}", self.path(name)), e))
    }

    /// The object at `name`, or `None` when there is none.
    pub(crate) fn get(&self, name: &str) -> Result<Option<Bytes>> {
        self.prefetch(name)?
            .recv()
            .map_err(|_| Error::Io {
                what: "waiting for the replica's runtime",
                source: std::io::Error::other("the task was dropped"),
            })?
            .map_err(|e| failed(format!("reading {}", self.path(name)), e))
    }

    /// The first `len` bytes of `name` (fewer if it is shorter), or `None`.
    pub(crate) fn head_bytes(&self, name: &str, len: u64) -> Result<Option<Bytes>> {
        let (store, path) = (Arc::clone(&self.store), self.path(name));
        let out = block(async move {
            let size = match store.head(&path).await {
                Ok(m) => m.size,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            store.get_range(&path, 0..len.min(size)).await.map(Some)
        })?;
        match out {
            Ok(b) => Ok(b),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(format!("reading {}", self.path(name)), e)),
        }
    }

    /// The names under `dir` (relative to the prefix), sorted.
    pub(crate) fn list(&self, dir: &str) -> Result<Vec<String>> {
        let (store, path) = (Arc::clone(&self.store), self.path(dir));
        let out = block(async move {
            let mut names = Vec::new();
            let mut s = store.list(Some(&path));
            while let Some(m) = s.next().await {
                names.push(m?.location);
            }
            Ok::<_, object_store::Error>(names)
        })?;
        let listed = out.map_err(|e| failed(format!("listing {}", self.path(dir)), e))?;
        let mut names: Vec<String> = listed
            .into_iter()
            .filter_map(|p| {
                p.prefix_match(&self.prefix)
                    .map(|parts| parts.map(|s| s.as_ref().to_string()).collect::<Vec<_>>())
                    .map(|v| v.join("/"))
            })
            .collect();
        names.sort_unstable();
        Ok(names)
    }

    /// When `name` was last written (a HEAD), or `None` when it does not
    /// exist.
    pub(crate) fn modified(&self, name: &str) -> Result<Option<std::time::SystemTime>> {
        let (store, path) = (Arc::clone(&self.store), self.path(name));
        match block(async move { store.head(&path).await })? {
            Ok(m) => Ok(Some(m.last_modified.into())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(
                format!("reading the head of {}", self.path(name)),
                e,
            )),
        }
    }

    /// How many objects are under the prefix, whatever their names.
    pub(crate) fn count(&self) -> Result<u64> {
        let (store, path) = (Arc::clone(&self.store), self.prefix.clone());
        let out = block(async move {
            let mut n = 0u64;
            let mut s = store.list(Some(&path));
            while let Some(m) = s.next().await {
                m?;
                n += 1;
            }
            Ok::<_, object_store::Error>(n)
        })?;
        out.map_err(|e| failed(format!("listing {}", self.prefix), e))
    }

    /// Deletes `name` (nothing if it is gone already).
    pub(crate) fn delete(&self, name: &str) -> Result<()> {
        let (store, path) = (Arc::clone(&self.store), self.path(name));
        match block(async move { store.delete(&path).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(failed(format!("deleting {}", self.path(name)), e)),
        }
    }
}

/// Every object under a replica's prefix, by kind (one listing).
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Epochs of the owner objects, ascending.
    pub owners: Vec<u64>,
    /// Places of the segments, ascending.
    pub segments: Vec<u64>,
    /// Seqs of the snapshots with an index, ascending.
    pub indexes: Vec<u64>,
    /// Seqs of the snapshots with at least one part, ascending.
    pub parts: Vec<u64>,
}

impl Objects {
    /// Lists everything under the prefix and sorts it by kind. A name
    /// that is no replica object of this build (another store's prefix
    /// nested inside this one, a stray upload) is an error naming it: a
    /// replica whose contents cannot all be read is never taken as a
    /// smaller or empty one.
    pub(crate) fn listing(&self) -> Result<Listing> {
        let mut out = Listing::default();
        for name in self.list("")? {
            let part = name
                .strip_prefix("snap/")
                .and_then(|r| r.split_once('/'))
                .is_some_and(|(seq, p)| {
                    seq.len() == 20
                        && p.strip_prefix("part-")
                            .is_some_and(|d| d.len() == 6 && d.bytes().all(|b| b.is_ascii_digit()))
                });
            let plain =
                |dir: &str| number_in(&name, dir).filter(|_| name.len() == dir.len() + 1 + 20);
            if let Some(e) = plain("owner") {
                out.owners.push(e);
            } else if let Some(s) = plain("seg") {
                out.segments.push(s);
            } else if let Some(s) = number_in(&name, "snap").filter(|_| {
                name.ends_with("/index") && name.len() == "snap/".len() + 20 + "/index".len()
            }) {
                out.indexes.push(s);
            } else if let Some(s) = number_in(&name, "snap").filter(|_| part) {
                if out.parts.last() != Some(&s) {
                    out.parts.push(s);
                }
            } else {
                return Err(Error::Corrupt(format!(
                    "the replica at {} holds {}, which is no object of a dedupkv replica \
                     (another store's prefix inside this one, or something else wrote \
                     there); the replica is not used while it is there: give every store a \
                     prefix of its own",
                    self.path(""),
                    self.path(&name)
                )));
            }
        }
        for v in [
            &mut out.owners,
            &mut out.segments,
            &mut out.indexes,
            &mut out.parts,
        ] {
            v.sort_unstable();
            v.dedup();
        }
        Ok(out)
    }
}

/// The name of segment `seq`.
pub(crate) fn segment_name(seq: u64) -> String {
    format!("seg/{seq:020}")
}

/// The name of snapshot `seq`'s index.
pub(crate) fn index_name(seq: u64) -> String {
    format!("snap/{seq:020}/index")
}

/// The name of part `part` of snapshot `seq`.
pub(crate) fn part_name(seq: u64, part: u32) -> String {
    format!("snap/{seq:020}/part-{part:06}")
}

/// The name of epoch `epoch`'s owner object.
pub(crate) fn owner_name(epoch: u64) -> String {
    format!("owner/{epoch:020}")
}

/// The number in a listed name `dir/<20 digits>[/…]`, if it is one.
pub(crate) fn number_in(name: &str, dir: &str) -> Option<u64> {
    let rest = name.strip_prefix(dir)?.strip_prefix('/')?;
    let digits = rest.split('/').next()?;
    if digits.len() != 20 {
        return None;
    }
    digits.parse().ok()
}
