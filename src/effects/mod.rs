//! Effects that leave the system: work built on the public claim API
//! (`begin`, `complete`, `fail`), above the engine.
//!
//! - `retry`: a backoff policy ([`RetryPolicy`]) with jitter and a runner that performs one
//!   attempt of an operation under a claim.

mod retry;
mod rng;
mod run;

pub use retry::{Decision, ErrorClass, GiveUpReason, Jitter, RetryPolicy, RetryPolicyBuilder};
pub use run::Run;
