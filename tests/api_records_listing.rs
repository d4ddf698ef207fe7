//! `Store::records`: every live record listed once across pages, by
//! scope and age; expired and forgotten keys left out; a read-only store
//! lists; a cursor of another listing is refused.

use std::collections::BTreeSet;
use std::time::Duration;

use dedupkv::{Error, Key, Listing, ManualClock, Record, Store};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn all(store: &Store, mut listing: Listing) -> dedupkv::Result<Vec<Record>> {
    let mut out = Vec::new();
    loop {
        let page = store.records(&listing)?;
        out.extend(page.items);
        match page.next {
            Some(c) => listing = listing.after(c),
            None => return Ok(out),
        }
    }
}

fn ids(records: &[Record]) -> BTreeSet<String> {
    records
        .iter()
        .map(|r| String::from_utf8_lossy(r.key().id()).into_owned())
        .collect()
}

#[test]
fn every_live_key_once_across_pages_of_any_size() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path().join("s.redb"))?;
    let want: BTreeSet<String> = (0..250).map(|i| format!("k{i}")).collect();
    for id in &want {
        store.insert_if_absent(&Key::new("orders", id))?;
    }
    store.insert_if_absent(&Key::new("refunds", "r1"))?;
    for limit in [1, 7, 100, 1000] {
        let got = all(&store, Listing::new().scope("orders").limit(limit))?;
        assert_eq!(
            got.len(),
            want.len(),
            "limit {limit}: a key twice or missing"
        );
        assert_eq!(ids(&got), want);
    }
    assert_eq!(all(&store, Listing::new())?.len(), 251);
    Ok(())
}

#[test]
fn expired_and_forgotten_keys_are_left_out_and_age_counts_from_the_update() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(1_700_000_000_000);
    let store = Store::builder()
        .clock(clock.clone())
        .retention(Duration::from_secs(3600))
        .open(dir.path().join("s.redb"))?;
    store.insert_if_absent(&Key::new("t", "old"))?;
    store.insert_if_absent(&Key::new("t", "gone"))?;
    store.forget(&Key::new("t", "gone"))?;
    clock.advance(Duration::from_secs(1800));
    store.insert_if_absent(&Key::new("t", "new"))?;
    assert_eq!(
        ids(&all(&store, Listing::new())?),
        ["new", "old"].map(String::from).into()
    );
    let old = all(&store, Listing::new().older_than(Duration::from_secs(900)))?;
    assert_eq!(ids(&old), ["old".to_owned()].into());
    clock.advance(Duration::from_secs(2 * 3600));
    assert!(all(&store, Listing::new())?.is_empty());
    Ok(())
}

#[test]
fn a_read_only_store_lists_and_a_foreign_cursor_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.redb");
    let store = Store::open(&path)?;
    for id in ["a", "b", "c"] {
        store.insert_if_absent(&Key::new("t", id))?;
    }
    drop(store);
    let ro = Store::open_read_only(&path)?;
    let page = ro.records(&Listing::new().limit(1))?;
    let cursor = page.next.ok_or("no next page")?;
    assert_eq!(ids(&all(&ro, Listing::new())?).len(), 3);
    assert!(matches!(
        ro.dead_letters(&Listing::new().after(cursor)),
        Err(Error::InvalidArgument { .. })
    ));
    Ok(())
}

/// Pages follow one order (by key hash), whatever their size and the
/// number of shards a page walks: every page size gives the sequence of
/// one big page, and a cursor made by an open of 64 shards continues in
/// an open of 4 (a page walks the shards from its cursor's, in order).
#[test]
fn pages_of_any_size_and_any_shard_count_follow_one_order() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.redb");
    let store = Store::builder().shards(64).open(&path)?;
    let keys: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
    let keys: Vec<Key<'_>> = keys.iter().map(|id| Key::new("orders", id)).collect();
    store.insert_batch(&keys)?;
    store.insert_if_absent(&Key::new("refunds", "r1"))?;
    let order =
        |r: &[Record]| -> Vec<Vec<u8>> { r.iter().map(|r| r.key().id().to_vec()).collect() };
    let one = store.records(&Listing::new().limit(1_000))?;
    assert!(one.next.is_none());
    let want = order(&one.items);
    assert_eq!(want.len(), 501);
    for limit in [1, 7, 64, 100] {
        assert_eq!(
            order(&all(&store, Listing::new().limit(limit))?),
            want,
            "limit {limit}"
        );
    }
    let first = store.records(&Listing::new().limit(100))?;
    drop(store);
    let four = Store::builder().shards(4).open_read_only(&path)?;
    let mut rest = first.items;
    rest.extend(all(
        &four,
        Listing::new()
            .limit(33)
            .after(first.next.ok_or("one page")?),
    )?);
    assert_eq!(order(&rest), want, "continued across shard counts");
    // A scope's pages: the same order, that scope's keys only.
    let scoped: Vec<Vec<u8>> = want
        .iter()
        .filter(|id| id.starts_with(b"k"))
        .cloned()
        .collect();
    assert_eq!(
        order(&all(&four, Listing::new().scope("orders").limit(9))?),
        scoped
    );
    Ok(())
}
