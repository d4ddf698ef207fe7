//! The background threads of an open store: the evictor (if on) and the
//! index's grower. Dropping the last [`Threads`] stops and joins them.

use std::time::Duration;

use super::Engine;
use super::evict::Evictor;
use crate::index::Grower;
use crate::sync::Arc;
use crate::{Error, Result};

/// The threads of one open store (shared by its clones).
#[derive(Clone)]
pub(crate) struct Threads {
    _evictor: Option<Arc<Evictor>>,
    _grower: Option<Arc<Grower>>,
}

impl Threads {
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
                Grower::start(Arc::downgrade(engine), |e: &Engine| &e.index)
                    .map_err(|e| Error::Storage(redb::Error::Io(e)))?,
            ))
        };
        Ok(Threads {
            _evictor: evictor,
            _grower: grower,
        })
    }
}
