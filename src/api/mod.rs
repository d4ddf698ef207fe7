//! The public face: [`Store`], its builder and the claim handle. No locks,
//! no log records: each method delegates to the engine in a few lines.

pub(crate) mod builder;
pub(crate) mod claim;
pub(crate) mod dead_letter;
pub(crate) mod format;
pub(crate) mod intents;
pub(crate) mod listings;
pub(crate) mod order;
pub(crate) mod reconcile;
pub(crate) mod store;

pub use builder::StoreBuilder;
pub use claim::{Begin, Claim};
pub use store::Store;
