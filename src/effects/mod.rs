//! Effects that leave the system: work built on the public claim API
//! (`begin`, `complete`, `fail`, intents), above the engine.
//!
//! - `retry`: a backoff policy ([`RetryPolicy`]) with jitter;
//! - `limits`: its limits applied to one claim, before an attempt starts
//!   and after it failed (shared by both runners);
//! - `run`: the runner of one attempt of an effect without a provider to
//!   ask ([`RetryPolicy::run`]), answered as a [`Run`];
//! - `call`: the runner of an external call with a provider that
//!   deduplicates and can be asked ([`RetryPolicy::call`], [`Effect`]):
//!   intent, provider key, ask first after an interruption, the answer
//!   recorded, then complete, fail or dead-letter;
//! - `run_async` (feature `async`): both runners with async work, driving
//!   the same steps through the `AsyncStore`.

mod call;
mod limits;
mod retry;
mod rng;
mod run;
#[cfg(feature = "async")]
mod run_async;

pub use call::Effect;
pub use retry::{Decision, ErrorClass, GiveUpReason, Jitter, RetryPolicy, RetryPolicyBuilder};
pub use run::Run;
