//! A partition set hands its stores over with their partitions: a revoke
//! ships the tail and the next member (another set, another base
//! directory, the same object store) restores every completed key as a
//! duplicate; work in flight past the revoke's deadline is refused and its
//! claim taken over as interrupted; a begin racing a revoke is either in
//! the shipped tail or refused; an assign elsewhere fences the old owner;
//! a lost disk restores; partition ids are checked at their range; a
//! revoke keeps its deadline while the object store is down, its tail
//! left in the local file; a partition fenced on a member is not taken
//! back by a plain assign; extreme deadlines do not panic.

mod replica_kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dedupkv::partitions::PartitionSet;
use dedupkv::replica::{Replica, ReplicaMode, RestoreReason};
use dedupkv::{Begin, Durability, Error, Fingerprint, Key, Store};
use replica_kit::{Bucket, Faulty, TestResult};

const MODES: [ReplicaMode; 2] = [ReplicaMode::Asynchronous, ReplicaMode::Synchronous];
/// Generous: the tests wait on conditions, and a revoke returns as soon as
/// its work is done.
const DEADLINE: Duration = Duration::from_secs(30);

fn member(b: &Bucket, base: &std::path::Path, mode: ReplicaMode) -> PartitionSet {
    let objects = Arc::clone(&b.objects);
    let prefix = b.prefix.clone();
    PartitionSet::new(base, move |p| {
        let replica =
            Replica::new(Arc::clone(&objects), &format!("{prefix}/orders/{p}")).mode(mode);
        Ok(Store::builder()
            .durability(Durability::Immediate)
            .replica(replica))
    })
}

fn fp(id: &str) -> Fingerprint {
    Fingerprint::of(id)
}

/// Begins and completes `ids` on partition `p` of `set`.
fn complete_all(set: &PartitionSet, p: i32, ids: &[String]) -> TestResult {
    let work = set.work(p)?;
    for id in ids {
        let Begin::Started(claim) = work.begin(&Key::new("orders", id), fp(id))? else {
            panic!("{id} is new on partition {p}");
        };
        work.complete(&claim, id.as_bytes())?;
    }
    Ok(())
}

fn ids(p: i32, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("p{p}-evt-{i}")).collect()
}

#[test]
fn a_revoked_partition_brings_every_completed_key_to_its_next_member() -> TestResult {
    for mode in MODES {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let a = member(&b, &dir.path().join("a"), mode);
        let bm = member(&b, &dir.path().join("b"), mode);
        for p in [0, 1, 2] {
            let got = a.assign(p)?;
            assert!(got.restored.is_none(), "a new replica restores nothing");
            complete_all(&a, p, &ids(p, 50))?;
        }
        assert_eq!(a.assigned(), vec![0, 1, 2]);
        for p in [0, 1, 2] {
            let r = a.revoke(p, DEADLINE)?;
            assert_eq!(r.abandoned, 0);
            assert!(r.last_segment.is_some(), "{mode:?}: the tail was shipped");
        }
        assert!(a.assigned().is_empty());
        for p in [0, 1, 2] {
            let got = bm.assign(p)?;
            let restored = got.restored.expect("a new member restores");
            assert_eq!(restored.reason, RestoreReason::Missing);
            let work = bm.work(p)?;
            for id in ids(p, 50) {
                let begin = work.begin(&Key::new("orders", &id), fp(&id))?;
                assert!(
                    matches!(&begin, Begin::Completed(r) if r.outcome() == Some(id.as_bytes())),
                    "{mode:?}: {id} is a duplicate on the new member: {begin:?}"
                );
            }
        }
        // And back to the first member, whose local files are now stale.
        for p in [0, 1, 2] {
            complete_all(&bm, p, &[format!("p{p}-on-b")])?;
            bm.revoke(p, DEADLINE)?;
            let got = a.assign(p)?;
            assert!(
                matches!(got.restored.map(|r| r.reason), Some(RestoreReason::Fenced)),
                "{mode:?}: the old file was left by a fenced owner"
            );
            let work = a.work(p)?;
            for id in ids(p, 50).into_iter().chain([format!("p{p}-on-b")]) {
                assert!(matches!(
                    work.begin(&Key::new("orders", &id), fp(&id))?,
                    Begin::Completed(_)
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn work_in_flight_past_the_deadline_is_refused_and_its_claim_taken_over() -> TestResult {
    for mode in MODES {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let a = member(&b, &dir.path().join("a"), mode);
        let bm = member(&b, &dir.path().join("b"), mode);
        a.assign(7)?;
        let key = Key::new("orders", "slow");
        let work = a.work(7)?;
        let Begin::Started(old) = work.begin(&key, fp("slow"))? else {
            panic!("new")
        };
        // The claim is in the replica whatever the revoke's short deadline
        // leaves the tail.
        work.with(Store::sync_replica)?;
        // Taken before the call to the provider, as a worker does (once
        // the partition is revoked, its claims give out no key).
        let old_key = old.provider_key()?;
        // The handle is alive: the revoke waits for it until its deadline.
        let r = a.revoke(7, Duration::from_millis(50))?;
        assert_eq!(r.abandoned, 1);
        let err = work.complete(&old, b"late").unwrap_err();
        assert!(
            matches!(&err, Error::NotAssigned { partition: 7, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("partition 7"), "{err}");
        drop(work);
        bm.assign(7)?;
        let Begin::Started(new) = bm.work(7)?.begin(&key, fp("slow"))? else {
            panic!("{mode:?}: the abandoned claim is taken over at once")
        };
        assert!(new.interrupted());
        assert_eq!(new.provider_key()?, old_key);
        assert!(matches!(old.provider_key(), Ok(k) if k == old_key));
    }
    Ok(())
}

#[test]
fn a_revoke_waits_for_the_work_in_flight() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let a = member(&b, &dir.path().join("a"), ReplicaMode::Asynchronous);
    a.assign(1)?;
    let work = a.work(1)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let revoker = {
        let a = a.clone();
        std::thread::spawn(move || {
            let r = a.revoke(1, Duration::from_secs(600));
            let _ = tx.send(());
            r
        })
    };
    // New work is refused as soon as the revoke started ...
    while a.work(1).is_ok() {
        std::thread::yield_now();
    }
    assert!(matches!(
        a.work(1).map(|_| ()),
        Err(Error::NotAssigned { partition: 1, .. })
    ));
    // ... while the handle that was live still works, and the revoke waits.
    let Begin::Started(claim) = work.begin(&Key::new("orders", "x"), fp("x"))? else {
        panic!("new")
    };
    work.complete(&claim, b"done")?;
    assert!(
        rx.try_recv().is_err(),
        "the revoke waits for the live handle"
    );
    drop(work);
    let r = revoker.join().expect("revoker")?;
    assert_eq!(r.abandoned, 0);
    let bm = member(&b, &dir.path().join("b"), ReplicaMode::Asynchronous);
    bm.assign(1)?;
    assert!(matches!(
        bm.work(1)?.begin(&Key::new("orders", "x"), fp("x"))?,
        Begin::Completed(_)
    ));
    Ok(())
}

#[test]
fn a_begin_racing_a_revoke_is_in_the_shipped_tail_or_refused() -> TestResult {
    for mode in MODES {
        for round in 0..3 {
            let b = Bucket::new();
            let dir = tempfile::tempdir()?;
            let a = member(&b, &dir.path().join("a"), mode);
            a.assign(0)?;
            let stop = Arc::new(AtomicBool::new(false));
            let handlers: Vec<_> = (0..3)
                .map(|t| {
                    let (a, stop) = (a.clone(), Arc::clone(&stop));
                    std::thread::spawn(move || -> dedupkv::Result<(Vec<String>, Vec<String>)> {
                        let (mut begun, mut completed) = (Vec::new(), Vec::new());
                        for i in 0.. {
                            if stop.load(Ordering::SeqCst) {
                                break;
                            }
                            let Ok(work) = a.work(0) else { break };
                            let id = format!("r{round}-t{t}-{i}");
                            let key = Key::new("orders", &id);
                            match work.begin(&key, fp(&id)) {
                                Ok(Begin::Started(c)) => {
                                    begun.push(id.clone());
                                    match work.complete(&c, b"ok") {
                                        Ok(()) => completed.push(id),
                                        Err(Error::NotAssigned { partition: 0, .. }) => break,
                                        Err(e) => return Err(e),
                                    }
                                }
                                Ok(other) => panic!("{id} is new: {other:?}"),
                                Err(Error::NotAssigned { partition: 0, .. }) => break,
                                Err(e) => return Err(e),
                            }
                        }
                        Ok((begun, completed))
                    })
                })
                .collect();
            // Let the handlers get going, then revoke with a deadline short
            // enough that some handles are abandoned mid-work.
            while a
                .work(0)?
                .get(&Key::new("orders", &format!("r{round}-t0-5")))?
                .is_none()
            {
                std::thread::yield_now();
            }
            a.revoke(0, Duration::from_millis(round * 5))?;
            stop.store(true, Ordering::SeqCst);
            let bm = member(&b, &dir.path().join("b"), mode);
            bm.assign(0)?;
            let work = bm.work(0)?;
            for h in handlers {
                let (begun, completed) = h.join().expect("handler")?;
                for id in &begun {
                    let key = Key::new("orders", id);
                    match work.begin(&key, fp(id))? {
                        Begin::Completed(_) => {}
                        Begin::Started(c) => {
                            assert!(
                                c.interrupted() && !completed.contains(id),
                                "{mode:?}: {id} was begun before the revoke shipped the tail"
                            );
                            work.complete(&c, b"retaken")?;
                        }
                        other => panic!("{id}: {other:?}"),
                    }
                }
                for id in &completed {
                    assert!(matches!(
                        work.begin(&Key::new("orders", id), fp(id))?,
                        Begin::Completed(_)
                    ));
                }
            }
        }
    }
    Ok(())
}

#[test]
fn an_assign_elsewhere_fences_the_old_owner() -> TestResult {
    for mode in MODES {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let a = member(&b, &dir.path().join("a"), mode);
        let bm = member(&b, &dir.path().join("b"), mode);
        a.assign(4)?;
        complete_all(&a, 4, &ids(4, 10))?;
        a.work(4)?.with(Store::sync_replica)?;
        // The group moved partition 4 without telling the old member.
        let got = bm.assign(4)?;
        assert!(got.restored.is_some());
        let work = a.work(4)?;
        let late = work.insert_if_absent(&Key::new("orders", "late"));
        if mode == ReplicaMode::Synchronous {
            // Its next write finds the new owner's fence.
            assert!(matches!(&late, Err(Error::Fenced(_))), "{late:?}");
        } else {
            // Acknowledged from the local file, refused at its upload.
            assert!(matches!(
                work.with(Store::sync_replica),
                Err(Error::Fenced(_))
            ));
        }
        assert!(matches!(
            work.insert_if_absent(&Key::new("orders", "later")),
            Err(Error::Fenced(_))
        ));
        drop(work);
        // Its revoke answers the fencing, and the partition leaves the set.
        assert!(matches!(a.revoke(4, DEADLINE), Err(Error::Fenced(_))));
        assert!(a.assigned().is_empty());
        let work = bm.work(4)?;
        for id in ids(4, 10) {
            assert!(!work.insert_if_absent(&Key::new("orders", &id))?);
        }
        assert!(work.insert_if_absent(&Key::new("orders", "later"))?);
    }
    Ok(())
}

#[test]
fn a_lost_disk_restores() -> TestResult {
    for mode in MODES {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let base = dir.path().join("a");
        let a = member(&b, &base, mode);
        a.assign(0)?;
        complete_all(&a, 0, &ids(0, 20))?;
        a.revoke(0, DEADLINE)?;
        std::fs::remove_dir_all(&base)?;
        let got = a.assign(0)?;
        assert!(
            matches!(
                got.restored.as_ref().map(|r| r.reason),
                Some(RestoreReason::Missing)
            ),
            "{got:?}"
        );
        let work = a.work(0)?;
        for id in ids(0, 20) {
            assert!(matches!(
                work.begin(&Key::new("orders", &id), fp(&id))?,
                Begin::Completed(_)
            ));
        }
        // The same member, same disk: opened as it is, nothing restored.
        drop(work);
        a.revoke(0, DEADLINE)?;
        assert!(a.assign(0)?.restored.is_none());
    }
    Ok(())
}

#[test]
fn partition_ids_at_their_range_and_calls_out_of_turn() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let a = member(&b, &dir.path().join("a"), ReplicaMode::Asynchronous);
    for p in [-1, i32::MIN] {
        for err in [
            a.assign(p).map(|_| ()).unwrap_err(),
            a.work(p).map(|_| ()).unwrap_err(),
            a.revoke(p, DEADLINE).map(|_| ()).unwrap_err(),
        ] {
            assert!(
                matches!(&err, Error::InvalidArgument { what: "partition", reason } if reason.contains(&p.to_string())),
                "{err}"
            );
        }
    }
    for p in [0, i32::MAX] {
        a.assign(p)?;
        assert!(a.path_of(p).exists());
        complete_all(&a, p, &ids(p, 2))?;
    }
    assert_eq!(a.assigned(), vec![0, i32::MAX]);
    // Assigning twice is refused and leaves the partition as it was.
    let err = a.assign(0).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { reason, .. } if reason.contains("already assigned")),
        "{err}"
    );
    assert!(a.work(0)?.get(&Key::new("orders", "p0-evt-0"))?.is_some());
    // A revoke of a partition not assigned names it.
    let err = a.revoke(5, DEADLINE).unwrap_err();
    assert!(
        matches!(&err, Error::NotAssigned { partition: 5, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("partition 5"), "{err}");
    for p in [0, i32::MAX] {
        a.revoke(p, DEADLINE)?;
        assert!(matches!(
            a.revoke(p, DEADLINE),
            Err(Error::NotAssigned { .. })
        ));
        assert!(matches!(
            a.work(p).map(|_| ()),
            Err(Error::NotAssigned { .. })
        ));
    }
    Ok(())
}

#[test]
fn a_revoke_during_the_assign_waits_for_the_open_then_revokes() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let (entered_tx, entered) = std::sync::mpsc::channel::<()>();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = parking_lot::Mutex::new(go_rx);
    let objects = Arc::clone(&b.objects);
    let prefix = b.prefix.clone();
    let entered_tx = parking_lot::Mutex::new(entered_tx);
    let a = PartitionSet::new(dir.path().join("a"), move |p| {
        // Stands for a long restore: the open waits for the test.
        let _ = entered_tx.lock().send(());
        let _ = go_rx.lock().recv();
        Ok(Store::builder().replica(Replica::new(
            Arc::clone(&objects),
            &format!("{prefix}/orders/{p}"),
        )))
    });
    let assigner = {
        let a = a.clone();
        std::thread::spawn(move || a.assign(2))
    };
    entered.recv()?;
    let err = a.work(2).map(|_| ()).unwrap_err();
    assert!(
        matches!(&err, Error::NotAssigned { partition: 2, reason } if reason.contains("being assigned")),
        "{err}"
    );
    assert!(a.assign(2).is_err(), "a second assign while the first runs");
    let revoker = {
        let a = a.clone();
        std::thread::spawn(move || a.revoke(2, DEADLINE))
    };
    go.send(())?;
    assigner.join().expect("assigner")?;
    revoker.join().expect("revoker")?;
    assert!(a.assigned().is_empty());
    Ok(())
}

#[test]
fn a_builder_without_a_replica_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let a = PartitionSet::new(dir.path(), |_| Ok(Store::builder()));
    let err = a.assign(0).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("partition 0")),
        "{err}"
    );
    assert!(a.assigned().is_empty());
    Ok(())
}

#[test]
fn a_panicking_builder_leaves_the_partition_unassigned() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let objects = Arc::clone(&b.objects);
    let prefix = b.prefix.clone();
    let a = PartitionSet::new(dir.path(), move |p| {
        assert!(p != 3, "the builder of partition 3 panics");
        Ok(Store::builder().replica(Replica::new(
            Arc::clone(&objects),
            &format!("{prefix}/orders/{p}"),
        )))
    });
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.assign(3)));
    assert!(panicked.is_err());
    assert!(a.assigned().is_empty());
    assert!(matches!(
        a.revoke(3, DEADLINE),
        Err(Error::NotAssigned { partition: 3, .. })
    ));
    a.assign(1)?;
    assert_eq!(a.assigned(), vec![1]);
    Ok(())
}

/// A member whose replicas go through `faulty`, closing without a limit
/// of their own: only a revoke's deadline ends a close.
fn faulty_member(faulty: &Arc<Faulty>, b: &Bucket, base: &std::path::Path) -> PartitionSet {
    let objects: Arc<dyn dedupkv::replica::object_store::ObjectStore> = faulty.clone();
    let prefix = b.prefix.clone();
    PartitionSet::new(base, move |p| {
        let replica = Replica::new(Arc::clone(&objects), &format!("{prefix}/orders/{p}"))
            .close_timeout(Duration::MAX);
        Ok(Store::builder()
            .durability(Durability::Immediate)
            .replica(replica))
    })
}

#[test]
fn a_revoke_keeps_its_deadline_while_the_object_store_is_down() -> TestResult {
    for outage in ["refuses every write", "stalls every call"] {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let faulty = Faulty::new(Arc::clone(&b.objects));
        let a = faulty_member(&faulty, &b, &dir.path().join("a"));
        a.assign(2)?;
        complete_all(&a, 2, &ids(2, 5))?;
        a.work(2)?.with(Store::sync_replica)?;
        if outage == "refuses every write" {
            faulty.hold_puts.store(true, Ordering::SeqCst);
        } else {
            faulty.stall_ms.store(3_600_000, Ordering::SeqCst);
        }
        // Acknowledged from the local file; its upload cannot go through.
        let tail = vec!["p2-tail".to_string()];
        complete_all(&a, 2, &tail)?;
        let (tx, answer) = std::sync::mpsc::channel();
        let set = a.clone();
        std::thread::spawn(move || tx.send(set.revoke(2, Duration::from_millis(100))));
        let revoked = answer.recv_timeout(DEADLINE).unwrap_or_else(|_| {
            panic!("the object store {outage}: the revoke ignored its deadline")
        })?;
        assert!(!revoked.tail_shipped, "{outage}: {revoked:?}");
        assert!(a.assigned().is_empty());
        // The tail stayed in the local file: the object store back, the
        // same member takes the partition again, and ships it.
        faulty.hold_puts.store(false, Ordering::SeqCst);
        faulty.stall_ms.store(0, Ordering::SeqCst);
        a.assign(2)?;
        let r = a.revoke(2, DEADLINE)?;
        assert!(r.tail_shipped, "{outage}");
        let bm = member(&b, &dir.path().join("b"), ReplicaMode::Asynchronous);
        bm.assign(2)?;
        let work = bm.work(2)?;
        for id in ids(2, 5).iter().chain(&tail) {
            assert!(
                matches!(
                    work.begin(&Key::new("orders", id), fp(id))?,
                    Begin::Completed(_)
                ),
                "{outage}: {id} reached the next member"
            );
        }
    }
    Ok(())
}

#[test]
fn extreme_deadlines_and_close_timeouts_do_not_panic() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let faulty = Faulty::new(Arc::clone(&b.objects));
    let a = faulty_member(&faulty, &b, &dir.path().join("a"));
    for deadline in [Duration::MAX, Duration::ZERO] {
        a.assign(1)?;
        complete_all(&a, 1, &[format!("evt-{deadline:?}")])?;
        let r = a.revoke(1, deadline)?;
        if deadline == Duration::MAX {
            assert!(r.tail_shipped, "no deadline: the tail is shipped");
        }
    }
    a.assign(1)?;
    let all = a.revoke_all(Duration::MAX);
    assert!(matches!(all.as_slice(), [(1, Ok(_))]), "{all:?}");
    Ok(())
}

#[test]
fn a_fenced_partition_is_not_taken_back_by_a_plain_assign() -> TestResult {
    for mode in MODES {
        let b = Bucket::new();
        let dir = tempfile::tempdir()?;
        let a = member(&b, &dir.path().join("a"), mode);
        let bm = member(&b, &dir.path().join("b"), mode);
        a.assign(5)?;
        complete_all(&a, 5, &ids(5, 3))?;
        a.work(5)?.with(Store::sync_replica)?;
        // The group moved partition 5 to b without a's revoke.
        bm.assign(5)?;
        let work = a.work(5)?;
        let late = work.with(|s| {
            s.insert_if_absent(&Key::new("orders", "late"))?;
            s.sync_replica()
        });
        assert!(matches!(&late, Err(Error::Fenced(_))), "{mode:?}: {late:?}");
        drop(work);
        assert_eq!(a.fenced(), vec![5]);
        // The explicit call fails while the fenced store is still in the
        // set, and the partition stays fenced.
        assert!(matches!(
            a.assign_after_fence(5),
            Err(Error::InvalidArgument { .. })
        ));
        assert_eq!(a.fenced(), vec![5]);
        // A naive loop revokes and assigns again on `Fenced`: the revoke
        // says the partition was fenced, and the assign is refused rather
        // than fencing b in turn.
        let err = a.revoke(5, DEADLINE).unwrap_err();
        assert!(
            matches!(&err, Error::Fenced(m) if m.contains("partition 5") && m.contains("handed nothing over")),
            "{err}"
        );
        let err = a.assign(5).unwrap_err();
        assert!(
            matches!(&err, Error::Fenced(m) if m.contains("assign_after_fence(5)")),
            "{mode:?}: {err}"
        );
        assert!(a.assigned().is_empty());
        assert_eq!(a.fenced(), vec![5], "still fenced after the refusal");
        // b was not fenced back: it serves the partition, and ships.
        assert!(bm.work(5)?.insert_if_absent(&Key::new("orders", "on-b"))?);
        bm.work(5)?.with(Store::sync_replica)?;
        // The group hands the partition back: the explicit call takes it.
        bm.revoke(5, DEADLINE)?;
        a.assign_after_fence(5)?;
        assert!(a.fenced().is_empty());
        assert!(!a.work(5)?.insert_if_absent(&Key::new("orders", "on-b"))?);
        a.revoke(5, DEADLINE)?;
        a.assign(5)?; // a plain assign again, once it was not fenced since
    }
    Ok(())
}

#[test]
fn an_assign_that_loses_the_race_for_the_epoch_counts_as_fenced() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let faulty = Faulty::new(Arc::clone(&b.objects));
    let a = faulty_member(&faulty, &b, &dir.path().join("a"));
    faulty.rival_owner.store(true, Ordering::SeqCst);
    assert!(matches!(a.assign(6), Err(Error::Fenced(_))));
    assert_eq!(a.fenced(), vec![6]);
    assert!(matches!(a.assign(6), Err(Error::Fenced(m)) if m.contains("assign_after_fence(6)")));
    a.assign_after_fence(6)?;
    assert_eq!(a.assigned(), vec![6]);
    Ok(())
}
