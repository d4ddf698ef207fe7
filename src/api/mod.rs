//! The public face: [`Store`], its builder and the claim handle. No locks,
//! no log records: each method delegates to the engine in a few lines.
//! `backend.rs` is the engine as the implementation of the
//! [contract](crate::contract) the faces call; `async.rs` (feature
//! `async`) is the async face over the same calls; `wait.rs` waits for an
//! in-flight result.

#[cfg(feature = "async")]
pub(crate) mod r#async;
pub(crate) mod backend;
pub(crate) mod builder;
pub(crate) mod claim;
pub(crate) mod dead_letter;
pub(crate) mod format;
pub(crate) mod history;
pub(crate) mod intents;
pub(crate) mod listings;
pub(crate) mod order;
pub(crate) mod reconcile;
pub(crate) mod records;
pub(crate) mod store;
#[cfg(feature = "async")]
pub(crate) mod timer;
pub(crate) mod wait;

#[cfg(feature = "async")]
pub use r#async::AsyncStore;
pub use backend::StoreWaiter;
pub use builder::StoreBuilder;
pub use claim::{Begin, Claim};
pub use store::Store;
