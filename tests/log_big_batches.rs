//! Batches of any size: a call too large for one commit fails alone, and
//! commits whose records pass a row's size are split into several rows
//! (redb refuses a value over 3 GiB; a row over it poisoned the store).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dedupkv::{Error, Key, Result, Store};
use dedupkv_testkit::tempdir;
use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition, TableHandle};

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:06}")).collect()
}

fn keys(ids: &[String]) -> Vec<Key<'_>> {
    ids.iter().map(|id| Key::new("t", id)).collect()
}

#[test]
fn a_batch_over_the_limit_fails_alone_and_everyone_else_goes_on() -> Result<()> {
    let dir = tempdir();
    let store = Store::builder()
        .max_batch_bytes(10_000)
        .open(dir.path().join("s.redb"))?;
    let big = ids("big", 300); // 300 × (1 + 10 + 32) bytes: over 10,000
    let small = ids("small", 100); // 100 × 43: under
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| -> Result<()> {
        let other = s.spawn(|| -> Result<u64> {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let id = format!("other-{n}");
                assert!(store.insert_if_absent(&Key::new("t", &id))?);
                n += 1;
                done.store(n, Ordering::Relaxed);
            }
            Ok(n)
        });
        // Refused calls interleave with the other caller's acknowledged ones.
        while done.load(Ordering::Relaxed) < 50 {
            let err = store.insert_batch(&keys(&big)).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidInput {
                        what: "batch",
                        len: 12_900,
                        limit: 10_000
                    }
                ),
                "{err}"
            );
        }
        stop.store(true, Ordering::Relaxed);
        assert!(other.join().expect("other caller")? > 0);
        Ok(())
    })?;
    // Nothing of the refused batch was recorded; the store is not poisoned.
    assert_eq!(store.insert_batch(&keys(&small))?, vec![true; 100]);
    assert_eq!(store.insert_batch(&keys(&big[..200]))?, vec![true; 200]);
    Ok(())
}

/// Rows in every `log.*` table of a closed store file.
fn rows_in(path: &std::path::Path) -> u64 {
    let db = redb::Database::open(path).expect("redb open");
    let read = db.begin_read().expect("read");
    let names: Vec<String> = read
        .list_tables()
        .expect("list")
        .map(|t| t.name().to_string())
        .filter(|n| n.starts_with("log."))
        .collect();
    names
        .iter()
        .map(|n| {
            let def: TableDefinition<u64, &[u8]> = TableDefinition::new(n);
            read.open_table(def).expect("table").len().expect("len")
        })
        .sum()
}

#[test]
fn one_commit_larger_than_a_row_is_split_into_rows_and_reopens_whole() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    // No background eviction: its pass may commit on its own and the test
    // counts commits.
    let open = || {
        Store::builder()
            .row_split_bytes(4_096)
            .background_eviction(false)
            .open(&path)
    };
    let all = ids("k", 20_000);
    {
        let store = open()?;
        store.flush()?;
        let before = store.stats().commits;
        assert_eq!(store.insert_batch(&keys(&all))?, vec![true; all.len()]);
        // A lone caller commits its own batch: one commit, many rows.
        assert_eq!(store.stats().commits, before + 1);
        // Concurrent batches and single inserts share commits of many rows.
        std::thread::scope(|s| {
            for t in 0..4 {
                let store = &store;
                s.spawn(move || -> Result<()> {
                    let mine = ids(&format!("t{t}"), 5_000);
                    for chunk in mine.chunks(1_000) {
                        assert_eq!(store.insert_batch(&keys(chunk))?, vec![true; chunk.len()]);
                    }
                    Ok(())
                });
            }
        });
    }
    let rows = rows_in(&path);
    assert!(rows > 20, "the commits were not split: {rows} rows");
    let store = open()?;
    assert_eq!(store.insert_batch(&keys(&all))?, vec![false; all.len()]);
    for t in 0..4 {
        let mine = ids(&format!("t{t}"), 5_000);
        assert_eq!(store.insert_batch(&keys(&mine))?, vec![false; mine.len()]);
    }
    assert!(store.insert_if_absent(&Key::new("t", "new"))?);
    Ok(())
}
