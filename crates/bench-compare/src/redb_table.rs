//! Raw redb: the same keys in a table keyed by the key bytes, one write
//! transaction (one `Durability::Immediate` commit) per batch. redb has a
//! single writer, so get-then-insert inside the transaction is atomic.

use std::sync::Arc;

use redb::{Database, ReadableTable as _, TableDefinition};
use tempfile::TempDir;

use crate::contender::{Contender, Instance, Key16, Result, Worker};

const KEYS: TableDefinition<&[u8], ()> = TableDefinition::new("keys");
const OUTCOMES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("outcomes");

/// redb with one table per workload kind.
pub struct RedbTable;

impl Contender for RedbTable {
    fn id(&self) -> &'static str {
        "redb"
    }

    fn name(&self) -> String {
        "redb 4.6 table".into()
    }

    fn durability(&self) -> &'static str {
        "durable: fsync per write txn"
    }

    fn open(&self, _expected_keys: usize) -> Result<Box<dyn Instance>> {
        let dir = tempfile::tempdir()?;
        // The same page cache as dedupkv's default (redb's own is 1 GiB).
        let db = Database::builder()
            .set_cache_size(64 << 20)
            .create(dir.path().join("bench.redb"))?;
        let tx = db.begin_write()?;
        tx.open_table(KEYS)?;
        tx.open_table(OUTCOMES)?;
        tx.commit()?;
        Ok(Box::new(RedbInstance {
            db: Arc::new(db),
            _dir: dir,
        }))
    }
}

struct RedbInstance {
    db: Arc<Database>,
    _dir: TempDir,
}

impl Instance for RedbInstance {
    fn worker(&self) -> Result<Box<dyn Worker>> {
        Ok(Box::new(RedbWorker {
            db: Arc::clone(&self.db),
        }))
    }
}

struct RedbWorker {
    db: Arc<Database>,
}

impl Worker for RedbWorker {
    fn insert_batch(&mut self, keys: &[Key16]) -> Result<usize> {
        let tx = self.db.begin_write()?;
        let mut new = 0;
        {
            let mut table = tx.open_table(KEYS)?;
            for k in keys {
                if table.get(&k[..])?.is_none() {
                    table.insert(&k[..], ())?;
                    new += 1;
                }
            }
        }
        tx.commit()?;
        Ok(new)
    }

    fn begin_complete(&mut self, key: &Key16, outcome: &[u8]) -> Result<bool> {
        let tx = self.db.begin_write()?;
        let new = {
            let mut table = tx.open_table(OUTCOMES)?;
            let new = table.get(&key[..])?.is_none();
            if new {
                table.insert(&key[..], outcome)?;
            }
            new
        };
        tx.commit()?;
        Ok(new)
    }
}
