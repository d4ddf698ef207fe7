//! The background threads of an open store: the evictor (if on) and the
//! index's grower. Dropping the last [`Threads`] stops and joins them.

use std::time::Duration;

use super::Engine;
use crate::index::Grower;
use crate::sync::{Arc, Condvar, JoinHandle, Mutex, Weak};
use crate::{Error, Result};

/// The threads of one open store (shared by its clones).
#[derive(Clone)]
pub(crate) struct Threads {
    _evictor: Option<Arc<Evictor>>,
    _grower: Option<Arc<Grower>>,
}

impl Threads {
    /// No thread (a read-only store's).
    pub(crate) fn none() -> Threads {
        Threads {
            _evictor: None,
            _grower: None,
        }
    }

    /// Starts the evictor (if `background`, waking every `tick`) and the
    /// grower for `engine`.
    pub(crate) fn start(engine: &Arc<Engine>, background: bool, tick: Duration) -> Result<Threads> {
        let evictor = if background {
            Some(Arc::new(Evictor::start(Arc::downgrade(engine), tick)?))
        } else {
            None
        };
        // A model checker cannot follow a thread it did not start.
        let grower = if cfg!(dedupkv_loom) {
            None
        } else {
            Some(Arc::new(
                Grower::start(Arc::downgrade(engine), |e: &Engine| &e.index).map_err(|source| {
                    Error::Io {
                        what: "starting the index growth thread",
                        source,
                    }
                })?,
            ))
        };
        Ok(Threads {
            _evictor: evictor,
            _grower: grower,
        })
    }
}

/// The background evictor: wakes every `tick` and evicts. Dropping it stops
/// and joins the thread.
pub(crate) struct Evictor {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Evictor {
    pub(crate) fn start(inner: Weak<Engine>, tick: Duration) -> Result<Evictor> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = Arc::clone(&stop);
        let thread = crate::sync::spawn("dedupkv-evict", move || {
            let mut last_sweep = std::time::Instant::now();
            loop {
                {
                    let mut stopped = s.0.lock();
                    if !*stopped {
                        s.1.wait_for(&mut stopped, tick);
                    }
                    if *stopped {
                        return;
                    }
                }
                let Some(inner) = inner.upgrade() else { return };
                // The parked-event sweep scans every entity: a quarter of
                // `max_hold` apart (at least a second) is soon enough.
                let sweep_every = Duration::from_millis((inner.cfg.max_hold_ms / 4).max(1_000));
                let sweep_due = last_sweep.elapsed() >= sweep_every;
                let pass = inner
                    .evict()
                    .and_then(|_| {
                        if sweep_due {
                            last_sweep = std::time::Instant::now();
                            inner.sweep_parked().map(|_| ())
                        } else {
                            Ok(())
                        }
                    })
                    .and_then(|()| inner.maybe_compact());
                inner.wake_lapsed();
                inner.ticked();
                if let Err(e) = pass {
                    tracing::warn!(error = %e, "dedupkv background eviction failed");
                    if matches!(e, crate::Error::Poisoned(_)) {
                        return;
                    }
                }
            }
        })
        .map_err(|source| crate::Error::Io {
            what: "starting the eviction thread",
            source,
        })?;
        Ok(Evictor {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Evictor {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
