//! The engine as the contract's first implementation: each method of
//! [`contract`](crate::contract) in a few lines into the engine, which
//! decides and appends and returns the rows its answer rests on without
//! waiting for them; a shared backend (`PostgreSQL`, behind
//! [`SharedBackend`](crate::contract::SharedBackend)) beside it, as
//! lsm-tree's `AnyTree` holds either tree: each method is one `match`.

use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use crate::api::store::Backend;
use crate::contract::{
    Basis, BegunBatch, BoxedClaim, BoxedWaiter, DeadLetters, Intents, Order, Outcome, Pending,
    Read, Settle, Write,
};
use crate::engine::Engine;
use crate::engine::durable::Waiting;
use crate::sync::Arc;
use crate::types::{
    Advance, Answer, Began, BeginOptions, Delivered, Failure, Forget, Intent, Record, Resolution,
    SequenceOptions, Sequenced, Update,
};
use crate::{Begin, Claim, Fingerprint, Key, Result, Store};

/// The registration of a future awaiting a [`Store`]'s commit
/// ([`Settle::Waiter`]): opaque. Without the `async` feature a poll does
/// not register: it waits, as [`Settle::wait`] does.
///
/// # Examples
/// ```
/// let waiter = dedupkv::contract::StoreWaiter::default();
/// # let _ = waiter;
/// ```
#[derive(Default)]
pub struct StoreWaiter {
    slot: Option<Arc<Waiting>>,
    /// A shared backend's own waiter.
    shared: BoxedWaiter,
}

impl std::fmt::Debug for StoreWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWaiter")
            .field(
                "registered",
                &(self.slot.is_some() || self.shared.is_some()),
            )
            .finish()
    }
}

impl Settle for Store {
    type Waiter = StoreWaiter;

    #[inline]
    fn wait(&self, basis: Basis) -> Result<()> {
        match self.backend() {
            Backend::Engine(engine) => engine.wait_basis(basis),
            Backend::Shared(b) => b.wait(basis),
        }
    }

    fn poll_settled(
        &self,
        basis: Basis,
        waiter: &mut StoreWaiter,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        match self.backend() {
            Backend::Engine(engine) => engine.poll_basis(basis, &mut waiter.slot, cx),
            Backend::Shared(b) => b.poll_settled(basis, &mut waiter.shared, cx),
        }
    }

    fn stop_waiting(&self, waiter: &mut StoreWaiter) {
        match self.backend() {
            #[cfg(feature = "async")]
            Backend::Engine(engine) => {
                if let Some(slot) = waiter.slot.take() {
                    engine.stop_waiting(&slot);
                }
            }
            #[cfg(not(feature = "async"))]
            Backend::Engine(_) => {}
            Backend::Shared(b) => b.stop_waiting(&mut waiter.shared),
        }
    }
}

impl Read for Store {
    fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>> {
        match self.backend() {
            Backend::Engine(engine) => engine.get(key),
            Backend::Shared(b) => b.get(key),
        }
    }
}

/// A shared backend's answer to `begin`, its claim in a [`Claim`].
fn begun(began: Began<BoxedClaim>) -> Begin {
    began.map_claim(Claim::of_shared)
}

impl Write for Store {
    type Claim = Claim;

    #[inline]
    fn insert(&self, key: &Key<'_>, retention: Option<Duration>) -> Result<Pending<bool>> {
        match self.backend() {
            Backend::Engine(engine) => {
                let ms = retention.map(|d| engine.check_retention(d)).transpose()?;
                engine.insert(key, ms)
            }
            Backend::Shared(b) => b.insert(key, retention),
        }
    }

    fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Pending<Vec<bool>>> {
        self.count_batch("insert_batch", keys.len());
        match self.backend() {
            Backend::Engine(engine) => engine.insert_batch(keys),
            Backend::Shared(b) => b.insert_batch(keys),
        }
    }

    fn forget(&self, key: &Key<'_>) -> Result<Pending<Forget>> {
        match self.backend() {
            Backend::Engine(engine) => engine.forget(key),
            Backend::Shared(b) => b.forget(key),
        }
    }

    #[inline]
    fn begin(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Option<Intent<'_>>,
    ) -> Result<Pending<Begin>> {
        let engine = match self.backend() {
            Backend::Engine(engine) => engine,
            Backend::Shared(b) => {
                return Ok(b.begin(key, fingerprint, options, intent)?.map(begun));
            }
        };
        let begun = match intent {
            None => Engine::begin(engine, key, fingerprint, options)?,
            Some(intent) => Engine::begin_with_intent(engine, key, fingerprint, options, intent)?,
        };
        Ok(begun.map(Begin::from))
    }

    fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<BegunBatch<Claim>> {
        self.count_batch("begin_batch", items.len());
        match self.backend() {
            Backend::Engine(engine) => {
                let begun = Engine::begin_batch(engine, items)?;
                Ok(begun.map(|all| all.into_iter().map(|r| r.map(Begin::from)).collect()))
            }
            Backend::Shared(b) => {
                let began = b.begin_batch(items)?;
                Ok(began.map(|all| all.into_iter().map(|r| r.map(begun)).collect()))
            }
        }
    }

    #[inline]
    fn complete(&self, claim: &Claim, outcome: Outcome<'_>) -> Result<Pending<()>> {
        let engine = match self.backend() {
            Backend::Engine(engine) => engine,
            Backend::Shared(b) => return b.complete(claim.shared()?, outcome),
        };
        let ms = outcome
            .retention
            .map(|d| engine.check_retention(d))
            .transpose()?;
        engine.complete(
            claim.ticket()?,
            (outcome.tag, outcome.bytes),
            ms,
            outcome.amount,
        )
    }

    fn complete_batch(&self, items: &[(&Claim, &[u8])]) -> Result<Pending<Vec<Result<()>>>> {
        self.count_batch("complete_batch", items.len());
        match self.backend() {
            Backend::Engine(engine) => {
                let tickets = items
                    .iter()
                    .map(|(c, o)| Ok((c.ticket()?, *o)))
                    .collect::<Result<Vec<_>>>()?;
                engine.complete_batch(&tickets)
            }
            Backend::Shared(b) => {
                let claims = items
                    .iter()
                    .map(|(c, o)| Ok((c.shared()?, *o)))
                    .collect::<Result<Vec<_>>>()?;
                b.complete_batch(&claims)
            }
        }
    }

    fn fail(&self, claim: &Claim, failure: Failure<'_>) -> Result<Pending<()>> {
        match self.backend() {
            Backend::Engine(engine) => engine.fail(claim.ticket()?, failure),
            Backend::Shared(b) => b.fail(claim.shared()?, failure),
        }
    }

    fn renew(&self, claim: &Claim, by: Option<Duration>) -> Result<Pending<SystemTime>> {
        match self.backend() {
            Backend::Engine(engine) => {
                let ms = by.map(|d| engine.check_lease(d)).transpose()?;
                engine.renew(claim.ticket()?, ms)
            }
            Backend::Shared(b) => b.renew(claim.shared()?, by),
        }
    }

    fn max_outcome_len(&self) -> usize {
        Store::max_outcome_len(self)
    }
}

impl Order for Store {
    fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Pending<Advance>> {
        match self.backend() {
            Backend::Engine(engine) => engine.advance(entity, version),
            Backend::Shared(b) => b.advance(entity, version),
        }
    }

    fn apply_event(
        &self,
        event: &Key<'_>,
        entity: &Key<'_>,
        version: u64,
    ) -> Result<Pending<Update>> {
        match self.backend() {
            Backend::Engine(engine) => engine.apply_event(event, entity, version),
            Backend::Shared(b) => b.apply_event(event, entity, version),
        }
    }

    fn sequence(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Pending<Sequenced>> {
        match self.backend() {
            Backend::Engine(engine) => engine.sequence(entity, seq, payload, options),
            Backend::Shared(b) => b.sequence(entity, seq, payload, options),
        }
    }

    fn release_held(&self, entity: &Key<'_>) -> Result<Pending<Vec<Delivered>>> {
        match self.backend() {
            Backend::Engine(engine) => engine.release_held(entity),
            Backend::Shared(b) => b.release_held(entity),
        }
    }

    fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<Pending<usize>> {
        match self.backend() {
            Backend::Engine(engine) => engine.ack(entity, upto),
            Backend::Shared(b) => b.ack(entity, upto),
        }
    }
}

impl DeadLetters for Store {
    fn requeue(&self, key: &Key<'_>) -> Result<Pending<bool>> {
        match self.backend() {
            Backend::Engine(engine) => engine.requeue(key),
            Backend::Shared(b) => b.requeue(key),
        }
    }

    fn resolve(&self, key: &Key<'_>, resolution: Resolution<'_>) -> Result<Pending<bool>> {
        match self.backend() {
            Backend::Engine(engine) => engine.resolve(key, resolution),
            Backend::Shared(b) => b.resolve(key, resolution),
        }
    }
}

impl Intents for Store {
    fn mark_answered(&self, claim: &Claim, answer: Answer<'_>) -> Result<Pending<()>> {
        match self.backend() {
            Backend::Engine(engine) => engine.mark_answered(claim.ticket()?, &answer),
            Backend::Shared(b) => b.mark_answered(claim.shared()?, answer),
        }
    }
}
