//! Many threads racing over the same keys: every key has exactly one winner.

use std::collections::HashMap;
use std::sync::Barrier;

use dedupkv::{Begin, Fingerprint, Key, Result, Store};
use dedupkv_testkit::tempdir;

const THREADS: usize = 8;
const KEYS: usize = 10_000;

fn ids() -> Vec<String> {
    (0..KEYS).map(|i| format!("evt-{i:05}")).collect()
}

/// Runs `work(t)` on `threads` scoped threads, started together, and
/// returns each thread's result in thread order.
fn on_threads<T: Send>(threads: usize, work: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    work(t)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    })
}

/// Runs `op` for every key on every thread (each thread in its own order)
/// and returns, per key, how many threads won it.
fn race(store: &Store, op: impl Fn(&Store, &Key<'_>) -> Result<bool> + Sync) -> Vec<usize> {
    let ids = ids();
    let wins = on_threads(THREADS, |t| {
        let mut won = Vec::new();
        for j in 0..KEYS {
            // Threads walk the keys at different offsets and strides.
            let i = (j * (2 * t + 1) + t * 1_237) % KEYS;
            if op(store, &Key::new("race", &ids[i])).expect("op") {
                won.push(i);
            }
        }
        won
    });
    let mut per_key = vec![0; KEYS];
    for i in wins.into_iter().flatten() {
        per_key[i] += 1;
    }
    per_key
}

#[test]
fn insert_if_absent_has_exactly_one_winner_per_key() -> Result<()> {
    let dir = tempdir();
    let store = Store::open(dir.path().join("s.redb"))?;
    let per_key = race(&store, Store::insert_if_absent);
    assert_eq!(per_key.iter().sum::<usize>(), KEYS);
    assert!(
        per_key.iter().all(|&n| n == 1),
        "a key was won twice or never"
    );
    assert_eq!(store.stats().keys, KEYS as u64);
    assert_eq!(store.stats().duplicates, ((THREADS - 1) * KEYS) as u64);
    Ok(())
}

#[test]
fn begin_has_exactly_one_winner_per_key() -> Result<()> {
    let dir = tempdir();
    let store = Store::open(dir.path().join("s.redb"))?;
    let per_key = race(&store, |s, k| match s.begin(k, Fingerprint::of("p"))? {
        Begin::Started(claim) => {
            s.complete(&claim, k.id())?;
            Ok(true)
        }
        Begin::InProgress(_) | Begin::Completed(_) | Begin::DeadLettered(_) => Ok(false),
    });
    assert_eq!(per_key.iter().sum::<usize>(), KEYS);
    assert!(
        per_key.iter().all(|&n| n == 1),
        "a key was started twice or never"
    );
    // Every key replays the outcome its one winner stored.
    let mut outcomes = HashMap::new();
    for id in ids() {
        match store.begin(&Key::new("race", &id), Fingerprint::of("p"))? {
            Begin::Completed(rec) => {
                outcomes.insert(id.clone(), rec.outcome().map(<[u8]>::to_vec));
            }
            other => panic!("{id}: expected Completed, got {other:?}"),
        }
    }
    assert!(
        outcomes
            .iter()
            .all(|(id, o)| o.as_deref() == Some(id.as_bytes()))
    );
    Ok(())
}

#[test]
fn insert_batch_from_many_threads_has_one_winner_per_key() -> Result<()> {
    let dir = tempdir();
    let store = Store::open(dir.path().join("s.redb"))?;
    let ids = ids();
    let wins = on_threads(4, |t| {
        let mut won = 0;
        for chunk in ids.chunks(250).cycle().skip(t * 7).take(ids.len() / 250) {
            let keys: Vec<Key<'_>> = chunk.iter().map(|i| Key::new("b", i)).collect();
            won += store
                .insert_batch(&keys)
                .expect("batch")
                .iter()
                .filter(|b| **b)
                .count();
        }
        won
    });
    assert_eq!(wins.iter().sum::<usize>(), KEYS);
    assert_eq!(store.stats().keys, KEYS as u64);
    Ok(())
}
