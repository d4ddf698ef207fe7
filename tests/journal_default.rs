//! The journal by default: a store an open creates at a path gets one
//! (16 MiB), a store kept with one keeps it, a store kept without one
//! stays without (a rollback to the build that wrote it stays possible)
//! until `journal(Some(..))` or `upgrade(true)`, `journal(None)` settles
//! it, and a store on a caller's backend has none.

use std::path::{Path, PathBuf};

use dedupkv::{Key, Store};
use dedupkv_testkit::FaultBackend;

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn journal_of(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".journal");
    PathBuf::from(s)
}

fn key(id: &str) -> Key<'_> {
    Key::new("d", id)
}

#[test]
fn a_new_store_at_a_path_gets_a_16_mib_journal_and_keeps_it() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("s.redb");
    {
        let store = Store::open(&path)?;
        assert!(store.insert_if_absent(&key("a"))?);
    }
    assert_eq!(std::fs::metadata(journal_of(&path))?.len(), 16 << 20);
    // Reopened with the default: the journal stays, the key is there.
    let store = Store::open(&path)?;
    assert!(!store.insert_if_absent(&key("a"))?);
    drop(store);
    assert!(journal_of(&path).exists());
    // A crash image without the journal is refused: the store was kept
    // with one.
    std::fs::remove_file(journal_of(&path))?;
    let err = Store::open(&path)
        .err()
        .ok_or("opened without its journal")?;
    assert!(matches!(err, dedupkv::Error::Corrupt(_)), "{err}");
    Ok(())
}

#[test]
fn a_store_kept_without_a_journal_stays_without_until_asked() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("s.redb");
    {
        let store = Store::builder().journal(None).open(&path)?;
        assert!(store.insert_if_absent(&key("a"))?);
    }
    assert!(!journal_of(&path).exists());
    // The default does not change an existing store's format behind the
    // operator's back (a build without the journal refuses a store that
    // has one).
    {
        let store = Store::open(&path)?;
        assert!(store.insert_if_absent(&key("b"))?);
    }
    assert!(!journal_of(&path).exists());
    // The operator's upgrade takes it.
    {
        let store = Store::builder().upgrade(true).open(&path)?;
        assert!(store.insert_if_absent(&key("c"))?);
    }
    assert!(journal_of(&path).exists());
    // Off again: settled into the file and removed, every key kept.
    let store = Store::builder().journal(None).open(&path)?;
    assert!(!journal_of(&path).exists());
    for id in ["a", "b", "c"] {
        assert!(store.get(&key(id))?.is_some(), "{id} is missing");
    }
    Ok(())
}

#[test]
fn an_explicit_journal_is_put_in_front_of_an_existing_store() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("s.redb");
    drop(Store::builder().journal(None).open(&path)?);
    {
        let store = Store::builder().journal(Some(1 << 20)).open(&path)?;
        assert!(store.insert_if_absent(&key("a"))?);
    }
    assert_eq!(std::fs::metadata(journal_of(&path))?.len(), 1 << 20);
    Ok(())
}

#[test]
fn a_store_on_a_backend_has_no_journal_by_default() -> TestResult {
    let db = FaultBackend::new();
    let store = Store::builder().open_with_backend(db.clone())?;
    assert!(store.insert_if_absent(&key("a"))?);
    drop(store);
    // Asked for, it needs a path or a journal backend.
    let err = Store::builder()
        .journal(Some(1 << 20))
        .open_with_backend(db)
        .err()
        .ok_or("a journal without a place for it")?;
    assert!(matches!(err, dedupkv::Error::InvalidConfig(_)), "{err}");
    Ok(())
}

#[test]
fn a_foreign_file_is_refused_and_no_journal_is_left_beside_it() -> TestResult {
    let dir = dedupkv_testkit::tempdir();
    let path = dir.path().join("other.redb");
    {
        let db = redb::Database::create(&path)?;
        let txn = db.begin_write()?;
        txn.open_table(redb::TableDefinition::<u64, u64>::new("theirs"))?
            .insert(1, 2)?;
        txn.commit()?;
    }
    let err = Store::open(&path).err().ok_or("a foreign file opened")?;
    assert!(matches!(err, dedupkv::Error::NotAStore(_)), "{err}");
    assert!(
        !journal_of(&path).exists(),
        "the default journal was made beside a file that is not a store"
    );
    Ok(())
}
