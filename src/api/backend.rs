//! The engine as the contract's first implementation: each method of
//! [`contract`](crate::contract) in a few lines into the engine, which
//! decides and appends and returns the rows its answer rests on without
//! waiting for them. A second backend goes here beside it (an enum of
//! the two, as lsm-tree's `AnyTree`), under the same faces.

use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use crate::contract::{
    Basis, BegunBatch, DeadLetters, Intents, Order, Outcome, Pending, Read, Settle, Write,
};
use crate::engine::Engine;
use crate::engine::durable::Waiting;
use crate::sync::Arc;
use crate::types::{
    Advance, Answer, BeginOptions, Delivered, Failure, Forget, Intent, Record, Resolution,
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
}

impl std::fmt::Debug for StoreWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWaiter")
            .field("registered", &self.slot.is_some())
            .finish()
    }
}

impl Settle for Store {
    type Waiter = StoreWaiter;

    #[inline]
    fn wait(&self, basis: Basis) -> Result<()> {
        self.engine().wait_basis(basis)
    }

    fn poll_settled(
        &self,
        basis: Basis,
        waiter: &mut StoreWaiter,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        self.engine().poll_basis(basis, &mut waiter.slot, cx)
    }

    fn stop_waiting(&self, waiter: &mut StoreWaiter) {
        #[cfg(feature = "async")]
        if let Some(slot) = waiter.slot.take() {
            self.engine().stop_waiting(&slot);
        }
        #[cfg(not(feature = "async"))]
        let _ = waiter;
    }
}

impl Read for Store {
    fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>> {
        self.engine().get(key)
    }
}

impl Write for Store {
    type Claim = Claim;

    #[inline]
    fn insert(&self, key: &Key<'_>, retention: Option<Duration>) -> Result<Pending<bool>> {
        let engine = self.engine();
        let ms = retention.map(|d| engine.check_retention(d)).transpose()?;
        engine.insert(key, ms)
    }

    fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Pending<Vec<bool>>> {
        self.count_batch("insert_batch", keys.len());
        self.engine().insert_batch(keys)
    }

    fn forget(&self, key: &Key<'_>) -> Result<Pending<Forget>> {
        self.engine().forget(key)
    }

    #[inline]
    fn begin(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Option<Intent<'_>>,
    ) -> Result<Pending<Begin>> {
        let engine = self.engine();
        let begun = match intent {
            None => Engine::begin(engine, key, fingerprint, options)?,
            Some(intent) => Engine::begin_with_intent(engine, key, fingerprint, options, intent)?,
        };
        Ok(begun.map(Begin::from))
    }

    fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<BegunBatch<Claim>> {
        self.count_batch("begin_batch", items.len());
        let begun = Engine::begin_batch(self.engine(), items)?;
        Ok(begun.map(|all| all.into_iter().map(|r| r.map(Begin::from)).collect()))
    }

    #[inline]
    fn complete(&self, claim: &Claim, outcome: Outcome<'_>) -> Result<Pending<()>> {
        let engine = self.engine();
        let ms = outcome
            .retention
            .map(|d| engine.check_retention(d))
            .transpose()?;
        engine.complete(
            claim.ticket(),
            (outcome.tag, outcome.bytes),
            ms,
            outcome.amount,
        )
    }

    fn complete_batch(&self, items: &[(&Claim, &[u8])]) -> Result<Pending<Vec<Result<()>>>> {
        self.count_batch("complete_batch", items.len());
        let tickets: Vec<_> = items.iter().map(|(c, o)| (c.ticket(), *o)).collect();
        self.engine().complete_batch(&tickets)
    }

    fn fail(&self, claim: &Claim, failure: Failure<'_>) -> Result<Pending<()>> {
        self.engine().fail(claim.ticket(), failure)
    }

    fn renew(&self, claim: &Claim, by: Option<Duration>) -> Result<Pending<SystemTime>> {
        let engine = self.engine();
        let ms = by.map(|d| engine.check_lease(d)).transpose()?;
        engine.renew(claim.ticket(), ms)
    }
}

impl Order for Store {
    fn advance(&self, entity: &Key<'_>, version: u64) -> Result<Pending<Advance>> {
        self.engine().advance(entity, version)
    }

    fn apply_event(
        &self,
        event: &Key<'_>,
        entity: &Key<'_>,
        version: u64,
    ) -> Result<Pending<Update>> {
        self.engine().apply_event(event, entity, version)
    }

    fn sequence(
        &self,
        entity: &Key<'_>,
        seq: u64,
        payload: &[u8],
        options: &SequenceOptions,
    ) -> Result<Pending<Sequenced>> {
        self.engine().sequence(entity, seq, payload, options)
    }

    fn release_held(&self, entity: &Key<'_>) -> Result<Pending<Vec<Delivered>>> {
        self.engine().release_held(entity)
    }

    fn ack(&self, entity: &Key<'_>, upto: u64) -> Result<Pending<usize>> {
        self.engine().ack(entity, upto)
    }
}

impl DeadLetters for Store {
    fn requeue(&self, key: &Key<'_>) -> Result<Pending<bool>> {
        self.engine().requeue(key)
    }

    fn resolve(&self, key: &Key<'_>, resolution: Resolution<'_>) -> Result<Pending<bool>> {
        self.engine().resolve(key, resolution)
    }
}

impl Intents for Store {
    fn mark_answered(&self, claim: &Claim, answer: Answer<'_>) -> Result<Pending<()>> {
        self.engine().mark_answered(claim.ticket(), &answer)
    }
}
