//! A set of stores, one per assigned partition (feature "replica"): the
//! stores move with their partitions when a consumer group (Kafka's, or
//! any broker's assignment) hands a partition to another process.
//!
//! Each partition's store lives at `BASE/partition-P/store.redb` and
//! ships to its own replica (the user's function makes its builder).
//! [`PartitionSet::assign`] takes ownership of the replica (fencing an
//! earlier owner), restores the file when it must and opens it;
//! [`PartitionSet::revoke`] refuses new work for the partition, waits for
//! the work in flight, ships the tail and closes, all by a deadline, so
//! the next owner restores everything this one acknowledged (or, past the
//! deadline, is told the tail stayed behind).
//!
//! A partition whose store answered [`Error::Fenced`] on this member (a
//! call through [`Work`], its assign, its revoke) is remembered: another
//! member took it over, so a plain [`PartitionSet::assign`] of it is
//! refused, and only [`PartitionSet::assign_after_fence`], the caller's
//! word that the group gave it back to this member, takes it again. Two
//! members whose loops re-assign on `Fenced` would otherwise fence each
//! other back and forth, each charging what the other had begun.
//!
//! Invariants:
//! - a partition's store is reached only through a [`Work`] handle, and
//!   each call of a handle holds the partition's read lock for the call;
//!   revoke takes the store out under the write lock before it ships the
//!   tail, so every record is either committed before the tail is
//!   shipped or refused: never recorded after it;
//! - a [`Work`] handle is handed out only while the partition is open;
//!   revoke first stops handing them out, then waits for the live ones,
//!   so a begin racing a revoke either runs before the revoke's wait
//!   ends or is refused with [`Error::NotAssigned`] naming the
//!   partition;
//! - a partition is in the set from the start of its assign until its
//!   store is closed: assigning it again meanwhile is refused, and the
//!   same file is never open twice;
//! - a partition seen fenced stays in the set's fenced list (past its
//!   revoke) until `assign_after_fence` takes it again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use crate::contract::{Basis, BegunBatch, Outcome, Pending, Read, Settle, StoreWaiter, Write};
use crate::replica::Restored;
use crate::sync::{Arc, Condvar, Mutex, RwLock};
use crate::{
    Begin, BeginOptions, Claim, Error, Failure, Fingerprint, Forget, Intent, Key, Record, Result,
    Store, StoreBuilder,
};

/// How a [`PartitionSet`] makes the builder of one partition's store.
type MakeBuilder = dyn Fn(i32) -> Result<StoreBuilder> + Send + Sync;

/// A set of stores, one per assigned partition, each with its own replica
/// (feature "replica"). Rebalance callbacks drive it: [`assign`](Self::assign)
/// when the group hands this member a partition, [`revoke`](Self::revoke)
/// when it takes one away. Handlers reach a partition's store through
/// [`work`](Self::work).
///
/// A revoke keeps its deadline, also with the object store down (a tail
/// not shipped by then stays in the local file: see
/// [`Revoked::tail_shipped`]). A partition whose store answered
/// [`Error::Fenced`] here is another member's: `assign` refuses it until
/// [`assign_after_fence`](Self::assign_after_fence), so never re-assign in
/// answer to `Fenced`; re-assign when the group hands the partition back.
///
/// Cheap to clone (an `Arc`); share it between the rebalance callback and
/// the handlers.
///
/// # Examples
/// ```
/// use dedupkv::partitions::PartitionSet;
/// use dedupkv::replica::{Replica, ReplicaMode, object_store::local::LocalFileSystem};
/// use dedupkv::{Begin, Fingerprint, Key, Store};
/// use std::{sync::Arc, time::Duration};
/// # let dir = tempfile::tempdir().unwrap();
/// # let bucket = dir.path().join("bucket");
/// # std::fs::create_dir(&bucket).unwrap();
/// let objects = Arc::new(LocalFileSystem::new_with_prefix(&bucket)?);
/// let stores = move |p: i32| {
///     let replica = Replica::new(objects.clone(), &format!("orders/{p}"))
///         .mode(ReplicaMode::Synchronous);
///     Ok(Store::builder().replica(replica))
/// };
/// let member_a = PartitionSet::new(dir.path().join("a"), stores.clone());
/// member_a.assign(3)?;
/// let key = Key::new("orders", "evt-1");
/// let work = member_a.work(3)?;
/// if let Begin::Started(claim) = work.begin(&key, Fingerprint::of("evt-1"))? {
///     work.complete(&claim, b"done")?; // after the effect
/// }
/// drop(work);
/// member_a.revoke(3, Duration::from_secs(10))?; // waits, ships the tail, closes
///
/// // Another member (another machine): the store comes with the partition.
/// let member_b = PartitionSet::new(dir.path().join("b"), stores);
/// assert!(member_b.assign(3)?.restored.is_some());
/// assert!(matches!(member_b.work(3)?.begin(&key, Fingerprint::of("evt-1"))?, Begin::Completed(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PartitionSet {
    inner: Arc<Inner>,
}

struct Inner {
    base: PathBuf,
    make: Box<MakeBuilder>,
    slots: Mutex<HashMap<i32, Arc<Slot>>>,
    fences: Arc<Fences>,
}

/// The partitions whose store answered [`Error::Fenced`] on this member,
/// each with why.
#[derive(Default)]
struct Fences(Mutex<HashMap<i32, String>>);

impl Fences {
    /// Notes `partition` as fenced if `result` says so.
    fn note<T>(&self, partition: i32, result: &Result<T>) {
        if let Err(Error::Fenced(why)) = result {
            self.0
                .lock()
                .entry(partition)
                .or_insert_with(|| why.clone());
        }
    }

    fn why(&self, partition: i32) -> Option<String> {
        self.0.lock().get(&partition).cloned()
    }
}

/// One partition of the set.
struct Slot {
    partition: i32,
    /// The set's fenced partitions (a call of a [`Work`] handle adds to
    /// them).
    fences: Arc<Fences>,
    state: Mutex<SlotState>,
    changed: Condvar,
    /// `None` while opening and once revoked.
    store: RwLock<Option<Store>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Opening,
    Open,
    Revoking,
    /// The open failed or the revoke closed it; the slot is leaving the set.
    Gone,
}

struct SlotState {
    phase: Phase,
    /// Live [`Work`] handles.
    in_flight: usize,
}

impl std::fmt::Debug for PartitionSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionSet")
            .field("base", &self.inner.base)
            .field("assigned", &self.assigned())
            .finish_non_exhaustive()
    }
}

/// What [`PartitionSet::assign`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Assigned {
    /// The partition.
    pub partition: i32,
    /// The ownership epoch this member now holds for the partition's
    /// replica (an earlier owner is fenced).
    pub epoch: u64,
    /// What the open restored from the replica, if it restored (the local
    /// file was missing, older, or left by a fenced owner).
    pub restored: Option<Restored>,
    /// How long the assign took (ownership, restore and open).
    pub took: Duration,
}

/// What [`PartitionSet::revoke`] did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Revoked {
    /// The partition.
    pub partition: i32,
    /// How long it waited for the work in flight.
    pub waited: Duration,
    /// [`Work`] handles still alive at the deadline: their further calls
    /// answer [`Error::NotAssigned`], and their open claims are taken over
    /// by the next owner as interrupted (see [`Claim::interrupted`]).
    pub abandoned: usize,
    /// The last segment shipped before the store closed.
    pub last_segment: Option<u64>,
    /// Every write acknowledged here is in the replica. `false` when the
    /// deadline passed first (the object store slow or down): the tail
    /// stays in the local file only, and the next owner, restoring from
    /// the replica, does not see it (its keys are new there; its claims
    /// are not taken over as interrupted). Reassigned here later, the
    /// local file ships it.
    pub tail_shipped: bool,
    /// How long the whole revoke took.
    pub took: Duration,
}

fn check(partition: i32) -> Result<()> {
    if partition < 0 {
        return Err(Error::InvalidArgument {
            what: "partition",
            reason: format!("{partition} is negative; partitions are numbered from 0"),
        });
    }
    Ok(())
}

fn not_assigned(partition: i32, reason: &'static str) -> Error {
    Error::NotAssigned { partition, reason }
}

/// A revoke's tail gets at least this long (or the whole deadline, if
/// shorter), even when the work in flight used the deadline up.
const TAIL_AT_LEAST: Duration = Duration::from_millis(100);

impl PartitionSet {
    /// A set with no partition yet, keeping its stores under `base`;
    /// `stores` makes the builder of partition `p`'s store, with the
    /// replica of that partition (a prefix of its own, such as
    /// `"orders/3"`).
    ///
    /// # Examples
    /// See [`PartitionSet`].
    pub fn new(
        base: impl Into<PathBuf>,
        stores: impl Fn(i32) -> Result<StoreBuilder> + Send + Sync + 'static,
    ) -> PartitionSet {
        PartitionSet {
            inner: Arc::new(Inner {
                base: base.into(),
                make: Box::new(stores),
                slots: Mutex::new(HashMap::new()),
                fences: Arc::default(),
            }),
        }
    }

    /// Where partition `partition`'s store file is kept:
    /// `BASE/partition-P/store.redb`.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// let set = PartitionSet::new("/var/lib/orders", |_| Ok(dedupkv::Store::builder()));
    /// assert!(set.path_of(7).ends_with("partition-7/store.redb"));
    /// ```
    pub fn path_of(&self, partition: i32) -> PathBuf {
        self.inner
            .base
            .join(format!("partition-{partition}"))
            .join("store.redb")
    }

    /// The partitions this set serves now (open, opening or being
    /// revoked), in order.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// let set = PartitionSet::new("/var/lib/orders", |_| Ok(dedupkv::Store::builder()));
    /// assert!(set.assigned().is_empty());
    /// ```
    pub fn assigned(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.inner.slots.lock().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Takes `partition` over: makes its builder, takes ownership of its
    /// replica (an earlier owner, in this process or another, is fenced:
    /// its next upload, and from then on every call, answers
    /// [`Error::Fenced`]), restores the file when it is missing, older
    /// than the replica or left by a fenced owner, and opens it.
    ///
    /// A partition this set saw fenced (see [`fenced`](Self::fenced)) is
    /// refused: another member owns it now, and taking it back would
    /// fence that member in turn. Call
    /// [`assign_after_fence`](Self::assign_after_fence) once the group
    /// says this member owns it again.
    ///
    /// # Concurrent calls on the same partition
    /// A second assign while the first runs, or once it is open, is
    /// refused. A [`revoke`](Self::revoke) meanwhile waits for the open to
    /// finish, then revokes. [`work`](Self::work) answers
    /// [`Error::NotAssigned`] until the open is done.
    ///
    /// # Errors
    /// [`Error::Fenced`] for a partition this set saw fenced, naming
    /// `assign_after_fence`; [`Error::InvalidArgument`] for a negative
    /// partition or one already assigned to this set;
    /// [`Error::InvalidConfig`] when the builder has no replica; the
    /// errors of [`StoreBuilder::open`] (among them [`Error::Fenced`] when
    /// another member took the same replica at the same moment, after
    /// which the partition counts as fenced here). After an error the
    /// partition is not assigned.
    ///
    /// # Examples
    /// See [`PartitionSet`].
    pub fn assign(&self, partition: i32) -> Result<Assigned> {
        check(partition)?;
        self.timed(false, || self.assign_checked(partition))
    }

    /// [`assign`](Self::assign) of a partition number checked already.
    fn assign_checked(&self, partition: i32) -> Result<Assigned> {
        if let Some(why) = self.inner.fences.why(partition) {
            return Err(Error::Fenced(format!(
                "partition {partition} was fenced on this member ({why}); assign refuses it, \
                 so two members do not take it from each other in turn: call \
                 PartitionSet::assign_after_fence({partition}) once the group says this \
                 member owns it now"
            )));
        }
        self.take(partition, false)
    }

    /// [`assign`](Self::assign) of a partition this set saw fenced: the
    /// caller says this member owns it now (the group handed it back, its
    /// assignment generation is the current one), so the set forgets the
    /// fencing and takes the partition over, fencing whoever holds its
    /// replica. Call it from a rebalance callback's assignment, never in
    /// answer to a [`Error::Fenced`]: the member that fenced this one
    /// is the partition's owner until the group says otherwise. For a
    /// partition never fenced here it is `assign`.
    ///
    /// # Errors
    /// As [`assign`](Self::assign), except the refusal of a fenced
    /// partition.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::partitions::PartitionSet;
    /// use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// use dedupkv::{Error, Key, Store};
    /// use std::{sync::Arc, time::Duration};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let objects = Arc::new(InMemory::new());
    /// let stores = move |p: i32| {
    ///     Ok(Store::builder().replica(Replica::new(objects.clone(), &format!("orders/{p}"))))
    /// };
    /// let (a, b) = (
    ///     PartitionSet::new(dir.path().join("a"), stores.clone()),
    ///     PartitionSet::new(dir.path().join("b"), stores),
    /// );
    /// a.assign(0)?;
    /// b.assign(0)?; // the group moved partition 0 without a's revoke
    /// let late = a.work(0)?.with(|s| {
    ///     s.insert_if_absent(&Key::new("t", "late"))?;
    ///     s.sync_replica()
    /// });
    /// assert!(matches!(late, Err(Error::Fenced(_))));
    /// assert_eq!(a.fenced(), vec![0]);
    /// assert!(matches!(a.revoke(0, Duration::from_secs(5)), Err(Error::Fenced(_))));
    /// assert!(matches!(a.assign(0), Err(Error::Fenced(_)))); // refused: b owns it
    /// b.revoke(0, Duration::from_secs(5))?; // the group hands it back to a
    /// a.assign_after_fence(0)?;
    /// assert!(a.fenced().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn assign_after_fence(&self, partition: i32) -> Result<Assigned> {
        check(partition)?;
        self.timed(false, || self.take(partition, true))
    }

    /// Runs an assign (`revoke: false`) or a revoke, publishing its
    /// duration and the partitions assigned after it (feature "metrics").
    // Without "metrics" it only runs `run`.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn timed<T>(&self, revoke: bool, run: impl FnOnce() -> Result<T>) -> Result<T> {
        #[cfg(feature = "metrics")]
        let start = Instant::now();
        let done = run();
        #[cfg(feature = "metrics")]
        crate::metrics::partition_change(
            &self.inner.base,
            revoke,
            (start.elapsed(), done.is_ok()),
            self.inner.slots.lock().len(),
        );
        #[cfg(not(feature = "metrics"))]
        let _ = revoke;
        done
    }

    /// The partitions this set saw fenced, in order: their stores answered
    /// [`Error::Fenced`] (a call through [`Work`], an assign, a revoke),
    /// because another member took them over. [`assign`](Self::assign)
    /// refuses them; [`assign_after_fence`](Self::assign_after_fence)
    /// takes one again and takes it off this list.
    ///
    /// # Examples
    /// See [`assign_after_fence`](Self::assign_after_fence).
    pub fn fenced(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.inner.fences.0.lock().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The assign itself; with `after_fence`, a successful open takes the
    /// partition off the fenced list (before any [`Work`] handle can see
    /// the store, so a fence of the new store is not forgotten).
    fn take(&self, partition: i32, after_fence: bool) -> Result<Assigned> {
        let start = Instant::now();
        let slot = {
            let mut slots = self.inner.slots.lock();
            if slots.contains_key(&partition) {
                return Err(Error::InvalidArgument {
                    what: "partition",
                    reason: format!("{partition} is already assigned to this set"),
                });
            }
            let slot = Arc::new(Slot {
                partition,
                fences: Arc::clone(&self.inner.fences),
                state: Mutex::new(SlotState {
                    phase: Phase::Opening,
                    in_flight: 0,
                }),
                changed: Condvar::new(),
                store: RwLock::new(None),
            });
            slots.insert(partition, Arc::clone(&slot));
            slot
        };
        // Until the open succeeds, leaving (by an error or a panic of the
        // user's builder function) takes the partition out of the set, so
        // a revoke waiting for the open is not left waiting.
        let mut leaving = Leaving {
            set: self,
            slot: &slot,
            armed: true,
        };
        let opened = self.open(partition);
        self.inner.fences.note(partition, &opened);
        let (store, epoch, restored) = opened?;
        if after_fence {
            self.inner.fences.0.lock().remove(&partition);
        }
        leaving.armed = false;
        *slot.store.write() = Some(store);
        slot.state.lock().phase = Phase::Open;
        slot.changed.notify_all();
        Ok(Assigned {
            partition,
            epoch,
            restored,
            took: start.elapsed(),
        })
    }

    fn open(&self, partition: i32) -> Result<(Store, u64, Option<Restored>)> {
        let builder = (self.inner.make)(partition)?;
        #[cfg(feature = "metrics")]
        let builder = builder.label_partition(partition);
        let path = self.path_of(partition);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Storage(crate::error::io_at(dir, &e)))?;
        }
        let store = builder.open(&path)?;
        let Some(status) = store.replica_status() else {
            return Err(Error::InvalidConfig(format!(
                "the builder of partition {partition} has no replica; a partition set's \
                 stores move with their partitions through their replicas"
            )));
        };
        Ok((store, status.epoch, status.restored))
    }

    fn remove(&self, slot: &Arc<Slot>) {
        let mut slots = self.inner.slots.lock();
        if slots
            .get(&slot.partition)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
        {
            slots.remove(&slot.partition);
        }
    }

    /// A handle to do work on `partition`'s store: hold it from the claim
    /// to the complete (a [`revoke`](Self::revoke) waits for the live
    /// handles, up to its deadline).
    ///
    /// # Errors
    /// [`Error::NotAssigned`] when the partition is not open in this set
    /// (never assigned, still opening, being revoked or revoked);
    /// [`Error::InvalidArgument`] for a negative partition.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// let set = PartitionSet::new("/var/lib/orders", |_| Ok(dedupkv::Store::builder()));
    /// let err = set.work(5).unwrap_err();
    /// assert!(matches!(err, dedupkv::Error::NotAssigned { partition: 5, .. }));
    /// ```
    pub fn work(&self, partition: i32) -> Result<Work> {
        check(partition)?;
        let Some(slot) = self.inner.slots.lock().get(&partition).cloned() else {
            return Err(not_assigned(partition, "is not assigned to this member"));
        };
        {
            let mut st = slot.state.lock();
            match st.phase {
                Phase::Open => st.in_flight += 1,
                Phase::Opening => return Err(not_assigned(partition, "is still being assigned")),
                Phase::Revoking => {
                    return Err(not_assigned(
                        partition,
                        "is being revoked from this member; its next owner serves it",
                    ));
                }
                Phase::Gone => return Err(not_assigned(partition, "was revoked from this member")),
            }
        }
        Ok(Work { slot })
    }

    /// Hands `partition` over, by `deadline`: new [`work`](Self::work)
    /// for it is refused at once, the live [`Work`] handles are waited for
    /// (past the deadline their further calls are refused; the next owner
    /// takes their claims over as interrupted), then the tail is shipped
    /// ([`Store::sync_replica`]) and the store closed, so the next owner
    /// restores everything acknowledged here.
    ///
    /// The deadline bounds the whole revoke, also while the object store
    /// is slow or down: should the work in flight use it up, the tail
    /// still gets 100 ms (or the deadline, if shorter), and a tail not
    /// shipped by then stays in the local file, which
    /// [`Revoked::tail_shipped`] says. `Duration::MAX` waits without a
    /// limit. (A call of a [`Work`] handle that is running, not just
    /// alive, is waited for: with a synchronous replica and the object
    /// store down, that is until its upload goes through.)
    ///
    /// # Concurrent calls on the same partition
    /// A revoke during the partition's assign waits for the open first. A
    /// call of a [`Work`] handle either finishes before the store is taken
    /// out (and its records are in the shipped tail) or answers
    /// [`Error::NotAssigned`]; none is recorded after the tail.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] when the partition is not assigned to this
    /// set (or another revoke of it runs); [`Error::InvalidArgument`] for
    /// a negative partition; [`Error::Fenced`] when another member took
    /// the partition over already (this set saw it fenced, or sees it
    /// now): nothing was handed over, and the partition stays on the
    /// [`fenced`](Self::fenced) list; the other errors of
    /// [`Store::sync_replica`]. In every case but the first two the
    /// partition has left the set and its store is closed.
    ///
    /// # Examples
    /// See [`PartitionSet`].
    pub fn revoke(&self, partition: i32, deadline: Duration) -> Result<Revoked> {
        check(partition)?;
        self.timed(true, || self.revoke_checked(partition, deadline))
    }

    /// [`revoke`](Self::revoke) of a partition number checked already.
    fn revoke_checked(&self, partition: i32, deadline: Duration) -> Result<Revoked> {
        let start = Instant::now();
        // `None`: a deadline too far to add to now is no limit.
        let until = start.checked_add(deadline);
        let Some(slot) = self.inner.slots.lock().get(&partition).cloned() else {
            return Err(not_assigned(partition, "is not assigned to this member"));
        };
        let abandoned = {
            let mut st = slot.state.lock();
            while st.phase == Phase::Opening {
                slot.changed.wait(&mut st);
            }
            match st.phase {
                Phase::Open => st.phase = Phase::Revoking,
                Phase::Revoking => return Err(not_assigned(partition, "is being revoked already")),
                Phase::Opening | Phase::Gone => {
                    return Err(not_assigned(partition, "is not assigned to this member"));
                }
            }
            while st.in_flight > 0 {
                match until {
                    Some(u) => {
                        if slot.changed.wait_until(&mut st, u).timed_out() {
                            break;
                        }
                    }
                    None => slot.changed.wait(&mut st),
                }
            }
            st.in_flight
        };
        let waited = start.elapsed();
        // Under the write lock no call of a handle runs; once the store is
        // out, none can start.
        let store = slot.store.write().take();
        let tail_until = until.map(|u| {
            Instant::now()
                .checked_add(TAIL_AT_LEAST.min(deadline))
                .map_or(u, |t| u.max(t))
        });
        let shipped = store
            .as_ref()
            .map_or(Ok(true), |s| s.sync_replica_until(tail_until));
        self.inner.fences.note(partition, &shipped);
        let last_segment = store
            .as_ref()
            .and_then(Store::replica_status)
            .and_then(|s| s.last_segment);
        drop(store);
        slot.state.lock().phase = Phase::Gone;
        self.remove(&slot);
        slot.changed.notify_all();
        if let Some(why) = self.inner.fences.why(partition) {
            return Err(Error::Fenced(format!(
                "partition {partition} was fenced on this member ({why}): its revoke handed \
                 nothing over, since another member took it over already and serves it from \
                 the replica as that member found it"
            )));
        }
        let tail_shipped = shipped?;
        if !tail_shipped {
            tracing::warn!(
                partition,
                "dedupkv revoke: the deadline passed before the tail was shipped; it stays \
                 in the local file"
            );
        }
        Ok(Revoked {
            partition,
            waited,
            abandoned,
            last_segment,
            tail_shipped,
            took: start.elapsed(),
        })
    }

    /// Revokes every partition of the set (see [`revoke`](Self::revoke)),
    /// each with the same `deadline`; answers each partition's result, in
    /// order.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// let set = PartitionSet::new("/var/lib/orders", |_| Ok(dedupkv::Store::builder()));
    /// assert!(set.revoke_all(std::time::Duration::from_secs(5)).is_empty());
    /// ```
    pub fn revoke_all(&self, deadline: Duration) -> Vec<(i32, Result<Revoked>)> {
        self.assigned()
            .into_iter()
            .map(|p| (p, self.revoke(p, deadline)))
            .collect()
    }

    /// The directory the set keeps its stores under.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// let set = PartitionSet::new("/var/lib/orders", |_| Ok(dedupkv::Store::builder()));
    /// assert_eq!(set.base(), std::path::Path::new("/var/lib/orders"));
    /// ```
    pub fn base(&self) -> &Path {
        &self.inner.base
    }
}

/// Takes a partition whose open did not finish out of the set.
struct Leaving<'a> {
    set: &'a PartitionSet,
    slot: &'a Arc<Slot>,
    armed: bool,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.slot.state.lock().phase = Phase::Gone;
            self.set.remove(self.slot);
            self.slot.changed.notify_all();
        }
    }
}

/// Work in flight on one partition's store, from
/// [`PartitionSet::work`]: the store's calls, each refused with
/// [`Error::NotAssigned`] once the partition was revoked. A revoke waits
/// (up to its deadline) until every handle of its partition is dropped:
/// hold one from the claim to the complete, and drop it before the next
/// poll.
///
/// # Examples
/// See [`PartitionSet`].
pub struct Work {
    slot: Arc<Slot>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("partition", &self.slot.partition)
            .finish_non_exhaustive()
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let mut st = self.slot.state.lock();
        st.in_flight -= 1;
        if st.in_flight == 0 {
            self.slot.changed.notify_all();
        }
    }
}

impl Work {
    /// The partition this handle works on.
    ///
    /// # Examples
    /// See [`PartitionSet`].
    pub fn partition(&self) -> i32 {
        self.slot.partition
    }

    /// Runs `f` on the partition's store, under the partition's read lock
    /// (a revoke's hand-over waits for it). Do not keep a clone of the
    /// store beyond `f`: calls through it are not fenced by the revoke.
    ///
    /// An [`Error::Fenced`] from `f` puts the partition on the set's
    /// [`fenced`](PartitionSet::fenced) list.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; `f`'s own.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// # use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let objects = std::sync::Arc::new(InMemory::new());
    /// # let set = PartitionSet::new(dir.path(), move |p| Ok(dedupkv::Store::builder()
    /// #     .replica(Replica::new(objects.clone(), &format!("p/{p}")))));
    /// # set.assign(0)?;
    /// let keys = set.work(0)?.with(|store| Ok(store.stats().keys))?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn with<R>(&self, f: impl FnOnce(&Store) -> Result<R>) -> Result<R> {
        let guard = self.slot.store.read();
        match guard.as_ref() {
            Some(store) => {
                let out = f(store);
                self.slot.fences.note(self.slot.partition, &out);
                out
            }
            None => Err(not_assigned(
                self.slot.partition,
                "was revoked from this member while this work was in flight; its next \
                 owner serves it",
            )),
        }
    }

    /// One call of the [contract](crate::contract) on the partition's
    /// store, told once its basis is settled, all under the partition's
    /// read lock (see [`with`](Self::with)): the body of every blocking
    /// call of this handle.
    fn blocking<T>(&self, op: impl FnOnce(&Store) -> Result<Pending<T>>) -> Result<T> {
        self.with(|s| s.tell(op(s)?))
    }

    /// [`Store::begin`] on the partition's store.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; those of
    /// [`Store::begin`].
    ///
    /// # Examples
    /// See [`PartitionSet`].
    pub fn begin(&self, key: &Key<'_>, fingerprint: Fingerprint) -> Result<Begin> {
        self.blocking(|s| Write::begin(s, key, fingerprint, &BeginOptions::new(), None))
    }

    /// [`Store::begin_with`] on the partition's store.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; those of
    /// [`Store::begin_with`].
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// # use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let objects = std::sync::Arc::new(InMemory::new());
    /// # let set = PartitionSet::new(dir.path(), move |p| Ok(dedupkv::Store::builder()
    /// #     .replica(Replica::new(objects.clone(), &format!("p/{p}")))));
    /// # set.assign(0)?;
    /// let opts = dedupkv::BeginOptions::default();
    /// let begin = set.work(0)?.begin_with(&dedupkv::Key::new("t", "a"), dedupkv::Fingerprint::of("a"), &opts)?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin_with(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
    ) -> Result<Begin> {
        self.blocking(|s| Write::begin(s, key, fingerprint, options, None))
    }

    /// [`Store::begin_batch`] on the partition's store.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; those of
    /// [`Store::begin_batch`].
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// # use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// # use dedupkv::{Begin, Fingerprint, Key};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let objects = std::sync::Arc::new(InMemory::new());
    /// # let set = PartitionSet::new(dir.path(), move |p| Ok(dedupkv::Store::builder()
    /// #     .replica(Replica::new(objects.clone(), &format!("p/{p}")))));
    /// # set.assign(0)?;
    /// let work = set.work(0)?;
    /// let items = [(Key::new("t", "a"), Fingerprint::of("a")), (Key::new("t", "b"), Fingerprint::of("b"))];
    /// let mut done = Vec::new();
    /// for begin in work.begin_batch(&items)? {
    ///     if let Begin::Started(claim) = begin? {
    ///         done.push(claim); // after its effect
    ///     }
    /// }
    /// let outcomes: Vec<_> = done.iter().map(|c| (c, &b"ok"[..])).collect();
    /// work.complete_batch(&outcomes)?;
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<Vec<Result<Begin>>> {
        self.blocking(|s| Write::begin_batch(s, items))
    }

    /// [`Store::complete`] on the partition's store.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; those of
    /// [`Store::complete`].
    ///
    /// # Examples
    /// See [`PartitionSet`].
    pub fn complete(&self, claim: &Claim, outcome: &[u8]) -> Result<()> {
        self.blocking(|s| Write::complete(s, claim, Outcome::raw(outcome)))
    }

    /// [`Store::complete_batch`] on the partition's store.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; those of
    /// [`Store::complete_batch`].
    ///
    /// # Examples
    /// See [`begin_batch`](Self::begin_batch).
    pub fn complete_batch(&self, items: &[(&Claim, &[u8])]) -> Result<Vec<Result<()>>> {
        self.blocking(|s| Write::complete_batch(s, items))
    }

    /// [`Store::fail`] on the partition's store.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; those of
    /// [`Store::fail`].
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// # use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// # use dedupkv::{Begin, Failure, Fingerprint, Key};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let objects = std::sync::Arc::new(InMemory::new());
    /// # let set = PartitionSet::new(dir.path(), move |p| Ok(dedupkv::Store::builder()
    /// #     .replica(Replica::new(objects.clone(), &format!("p/{p}")))));
    /// # set.assign(0)?;
    /// let work = set.work(0)?;
    /// if let Begin::Started(claim) = work.begin(&Key::new("t", "a"), Fingerprint::of("a"))? {
    ///     work.fail(&claim, Failure::Retryable)?;
    /// }
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn fail(&self, claim: &Claim, failure: Failure<'_>) -> Result<()> {
        self.blocking(|s| Write::fail(s, claim, failure))
    }

    /// [`Store::insert_if_absent`] on the partition's store.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; those of
    /// [`Store::insert_if_absent`].
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// # use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let objects = std::sync::Arc::new(InMemory::new());
    /// # let set = PartitionSet::new(dir.path(), move |p| Ok(dedupkv::Store::builder()
    /// #     .replica(Replica::new(objects.clone(), &format!("p/{p}")))));
    /// # set.assign(0)?;
    /// assert!(set.work(0)?.insert_if_absent(&dedupkv::Key::new("t", "evt-1"))?);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn insert_if_absent(&self, key: &Key<'_>) -> Result<bool> {
        self.blocking(|s| Write::insert(s, key, None))
    }

    /// [`Store::get`] on the partition's store.
    ///
    /// # Errors
    /// [`Error::NotAssigned`] once the partition was revoked; those of
    /// [`Store::get`].
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// # use dedupkv::replica::{Replica, object_store::memory::InMemory};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let objects = std::sync::Arc::new(InMemory::new());
    /// # let set = PartitionSet::new(dir.path(), move |p| Ok(dedupkv::Store::builder()
    /// #     .replica(Replica::new(objects.clone(), &format!("p/{p}")))));
    /// # set.assign(0)?;
    /// assert!(set.work(0)?.get(&dedupkv::Key::new("t", "evt-1"))?.is_none());
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn get(&self, key: &Key<'_>) -> Result<Option<Record>> {
        self.blocking(|s| Read::get(s, key))
    }
}

// The contract, on the partition's store: every call refused with
// `NotAssigned` once the partition was revoked. A new contract method
// does not compile until it is forwarded here too.

impl Settle for Work {
    type Waiter = StoreWaiter;

    fn wait(&self, basis: Basis) -> Result<()> {
        self.with(|s| s.wait(basis))
    }

    fn poll_settled(
        &self,
        basis: Basis,
        waiter: &mut StoreWaiter,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        let guard = self.slot.store.read();
        match guard.as_ref() {
            Some(store) => {
                let out = store.poll_settled(basis, waiter, cx);
                if let Poll::Ready(r) = &out {
                    self.slot.fences.note(self.slot.partition, r);
                }
                out
            }
            None => Poll::Ready(self.with(|_| Ok(()))),
        }
    }

    fn stop_waiting(&self, waiter: &mut StoreWaiter) {
        if let Some(store) = self.slot.store.read().as_ref() {
            store.stop_waiting(waiter);
        }
    }
}

impl Read for Work {
    fn get(&self, key: &Key<'_>) -> Result<Pending<Option<Record>>> {
        self.with(|s| Read::get(s, key))
    }
}

impl Write for Work {
    type Claim = Claim;

    fn insert(&self, key: &Key<'_>, retention: Option<Duration>) -> Result<Pending<bool>> {
        self.with(|s| Write::insert(s, key, retention))
    }

    fn insert_batch(&self, keys: &[Key<'_>]) -> Result<Pending<Vec<bool>>> {
        self.with(|s| Write::insert_batch(s, keys))
    }

    fn forget(&self, key: &Key<'_>) -> Result<Pending<Forget>> {
        self.with(|s| Write::forget(s, key))
    }

    fn begin(
        &self,
        key: &Key<'_>,
        fingerprint: Fingerprint,
        options: &BeginOptions,
        intent: Option<Intent<'_>>,
    ) -> Result<Pending<Begin>> {
        self.with(|s| Write::begin(s, key, fingerprint, options, intent))
    }

    fn begin_batch(&self, items: &[(Key<'_>, Fingerprint)]) -> Result<BegunBatch<Claim>> {
        self.with(|s| Write::begin_batch(s, items))
    }

    fn complete(&self, claim: &Claim, outcome: Outcome<'_>) -> Result<Pending<()>> {
        self.with(|s| Write::complete(s, claim, outcome))
    }

    fn complete_batch(&self, items: &[(&Claim, &[u8])]) -> Result<Pending<Vec<Result<()>>>> {
        self.with(|s| Write::complete_batch(s, items))
    }

    fn fail(&self, claim: &Claim, failure: Failure<'_>) -> Result<Pending<()>> {
        self.with(|s| Write::fail(s, claim, failure))
    }

    fn renew(&self, claim: &Claim, by: Option<Duration>) -> Result<Pending<SystemTime>> {
        self.with(|s| Write::renew(s, claim, by))
    }
}
