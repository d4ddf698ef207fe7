//! A replica's bad settings give a clear error, never a panic: an empty
//! prefix (or one of slashes only) is refused before anything is written;
//! a close timeout of `Duration::MAX` waits without a limit and one of
//! `Duration::ZERO` does not wait; a segment interval of `Duration::MAX`
//! still ships on `sync_replica`.

mod replica_kit;

use std::sync::Arc;
use std::time::Duration;

use dedupkv::replica::Replica;
use dedupkv::{Error, Key, Store};
use replica_kit::{Bucket, Faulty, TestResult};

#[test]
fn an_empty_prefix_is_refused_before_anything_is_written() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let faulty = Faulty::new(Arc::clone(&b.objects));
    for prefix in ["", "/", "///"] {
        let path = dir.path().join("s.redb");
        let err = Store::builder()
            .replica(Replica::new(faulty.clone(), prefix))
            .open(&path)
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig(m) if m.contains("prefix is empty")),
            "{prefix:?}: {err}"
        );
        assert!(!path.exists(), "{prefix:?}: no file was made");
    }
    assert_eq!(
        faulty.written(),
        0,
        "nothing was written at the bucket's root"
    );
    Ok(())
}

type Setting = fn(Replica) -> Replica;

#[test]
fn extreme_close_timeouts_and_intervals_do_not_panic() -> TestResult {
    let b = Bucket::new();
    let dir = tempfile::tempdir()?;
    let cases: [(&str, Setting); 3] = [
        ("close_timeout(MAX)", |r| r.close_timeout(Duration::MAX)),
        ("close_timeout(ZERO)", |r| r.close_timeout(Duration::ZERO)),
        ("segment_interval(MAX)", |r| {
            r.segment_interval(Duration::MAX)
        }),
    ];
    for (i, (what, set)) in cases.into_iter().enumerate() {
        let r = set(Replica::new(
            Arc::clone(&b.objects),
            &b.at(&format!("s{i}")),
        ));
        let store = Store::builder()
            .replica(r)
            .open(dir.path().join(format!("{i}.redb")))?;
        assert!(store.insert_if_absent(&Key::new("t", what))?, "{what}");
        store.sync_replica()?;
        drop(store); // the close waits (or not) without panicking
    }
    // A close without a limit ships the tail it was left.
    let r = Replica::new(Arc::clone(&b.objects), &b.at("tail")).close_timeout(Duration::MAX);
    let store = Store::builder()
        .replica(r.clone())
        .open(dir.path().join("tail.redb"))?;
    assert!(store.insert_if_absent(&Key::new("t", "tail"))?);
    drop(store);
    let other = Store::builder()
        .replica(r)
        .open(dir.path().join("other.redb"))?;
    assert!(!other.insert_if_absent(&Key::new("t", "tail"))?);
    Ok(())
}
