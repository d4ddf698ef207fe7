//! The simulated payment provider, in Redis, and the charge as an
//! [`Effect`] for [`RetryPolicy::call_async`](dedupkv::RetryPolicy::call_async).
//!
//! Invariants:
//! - the provider deduplicates by idempotency key: a repeated key returns
//!   the first charge and charges nothing (it counts the repeat);
//! - the idempotency key is the claim's provider key, taken in
//!   [`carrier_key`] and nowhere else;
//! - a charge is atomic (one Lua script): a member killed mid-call leaves
//!   all of it or none.

use std::fmt;
use std::pin::Pin;

use dedupkv::{Claim, Effect, ErrorClass, Intent};
use redis::aio::MultiplexedConnection;

/// The provider's keys in Redis, under one run's namespace.
#[derive(Clone, Debug)]
pub(crate) struct Books {
    /// idempotency key → charge reference.
    pub charges: String,
    /// order → how many charges were made for it.
    pub effects: String,
    /// order → `charge|at_ms|amount` (the system of record).
    pub ledger: String,
    /// How many sends came with a key already charged.
    pub repeats: String,
}

impl Books {
    pub(crate) fn new(ns: &str) -> Books {
        Books {
            charges: format!("{ns}:charges"),
            effects: format!("{ns}:effects"),
            ledger: format!("{ns}:ledger"),
            repeats: format!("{ns}:repeats"),
        }
    }
}

/// The charge for an idempotency key: new, or the first one. The
/// reference names the process that made it (`ch_KEY@MEMBER`), so an
/// answer replayed elsewhere says where it came from.
const CHARGE: &str = r"
local charge = 'ch_' .. ARGV[1] .. '@' .. ARGV[5]
if redis.call('HSETNX', KEYS[1], ARGV[1], charge) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
  redis.call('HSET', KEYS[3], ARGV[2], charge .. '|' .. ARGV[3] .. '|' .. ARGV[4])
else
  redis.call('INCR', KEYS[4])
end
return redis.call('HGET', KEYS[1], ARGV[1])
";

/// The idempotency key the provider gets for `claim`'s charge: the
/// claim's provider key, handed out only once the claim is where every
/// later owner reads it (`RetryPolicy::call_async` took it before these
/// closures run, so here it answers at once). The one place the run
/// takes it.
pub(crate) fn carrier_key(claim: &Claim) -> dedupkv::Result<String> {
    claim.provider_key()
}

/// What went wrong around a charge.
#[derive(Debug)]
pub(crate) enum CallError {
    /// Redis did not answer (the charge may have happened).
    Provider(redis::RedisError),
    /// The idempotency key could not be had; nothing was sent.
    Key(dedupkv::Error),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Provider(e) => write!(f, "the provider did not answer: {e}"),
            CallError::Key(e) => write!(f, "no idempotency key for the charge: {e}"),
        }
    }
}

/// No answer from the provider: the charge may have happened, so the next
/// attempt asks first. No key: nothing was sent; try again.
fn classify(e: &CallError) -> ErrorClass {
    match e {
        CallError::Provider(_) => ErrorClass::Unanswered,
        CallError::Key(_) => ErrorClass::Retryable,
    }
}

/// How the charge's effect asks the provider about a key.
type Lookup = Box<dyn FnOnce(&Claim) -> Asked<Option<Vec<u8>>>>;
/// How it charges.
type Send = Box<dyn FnOnce(&Claim) -> Asked<Vec<u8>>>;

/// One charge: what to ask, what to send.
pub(crate) struct Charge<'a> {
    pub books: &'a Books,
    pub con: &'a MultiplexedConnection,
    pub order: &'a str,
    pub amount: i64,
    /// Who charges (`member@pid`), for the reference.
    pub by: &'a str,
    pub request: &'a [u8],
}

/// A provider's answer under way (boxed: the effect's closures return
/// one type).
type Asked<T> = Pin<Box<dyn Future<Output = Result<T, CallError>>>>;

impl Charge<'_> {
    /// The charge as an effect: asked about with `HGET charges KEY`, made
    /// with the script; `after_send` runs once the provider has charged,
    /// before its answer is recorded (the run's pause point).
    pub(crate) fn effect(
        &self,
        after_send: impl FnOnce() + 'static,
    ) -> Effect<'_, Lookup, Send, fn(&CallError) -> ErrorClass> {
        let (books, con) = (self.books.clone(), self.con.clone());
        let lookup = move |claim: &Claim| {
            let key = carrier_key(claim);
            let (charges, mut con) = (books.charges, con);
            Box::pin(async move {
                let key = key.map_err(CallError::Key)?;
                redis::cmd("HGET")
                    .arg(charges)
                    .arg(key)
                    .query_async::<Option<Vec<u8>>>(&mut con)
                    .await
                    .map_err(CallError::Provider)
            }) as Asked<_>
        };
        let (books, mut con) = (self.books.clone(), self.con.clone());
        let (order, amount, by) = (self.order.to_string(), self.amount, self.by.to_string());
        let send = move |claim: &Claim| {
            let key = carrier_key(claim);
            Box::pin(async move {
                let key = key.map_err(CallError::Key)?;
                let charged = redis::cmd("EVAL")
                    .arg(CHARGE)
                    .arg(4)
                    .arg(&books.charges)
                    .arg(&books.effects)
                    .arg(&books.ledger)
                    .arg(&books.repeats)
                    .arg(key)
                    .arg(order)
                    .arg(crate::now_ms())
                    .arg(amount)
                    .arg(by)
                    .query_async::<Vec<u8>>(&mut con)
                    .await
                    .map_err(CallError::Provider)?;
                after_send();
                Ok(charged)
            }) as Asked<_>
        };
        Effect::new_async(
            Intent {
                target: "payments-provider",
                request: self.request,
            },
            Box::new(lookup) as Lookup,
            Box::new(send) as Send,
            classify as fn(&CallError) -> ErrorClass,
        )
        .amount(self.amount)
    }
}

/// The member a charge reference names (`ch_KEY@MEMBER`).
pub(crate) fn charged_by(reference: &[u8]) -> String {
    let r = String::from_utf8_lossy(reference);
    r.split_once('@')
        .map_or_else(|| "?".to_string(), |(_, by)| by.to_string())
}
