//! The ceiling: a mutex-sharded in-memory hash map, no durability at all.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use crate::contender::{Contender, Instance, Key16, Result, Worker};

const SHARDS: usize = 64;

/// Keys are already uniformly random bytes: fold them, do not re-hash them.
#[derive(Default)]
struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(w)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
}

type Map = HashMap<Key16, Option<Box<[u8]>>, BuildHasherDefault<FoldHasher>>;

/// `SHARDS` `Mutex<HashMap>`s, the shard picked by the key's last byte.
pub struct Memory;

impl Contender for Memory {
    fn id(&self) -> &'static str {
        "memory"
    }

    fn name(&self) -> String {
        "HashMap, 64 mutex shards".into()
    }

    fn durability(&self) -> &'static str {
        "memory only, no durability"
    }

    fn open(&self, expected_keys: usize) -> Result<Box<dyn Instance>> {
        let per = expected_keys.div_ceil(SHARDS);
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Map::with_capacity_and_hasher(
                    per,
                    BuildHasherDefault::default(),
                ))
            })
            .collect();
        Ok(Box::new(MemoryInstance {
            shards: Arc::new(shards),
        }))
    }
}

struct MemoryInstance {
    shards: Arc<Vec<Mutex<Map>>>,
}

impl Instance for MemoryInstance {
    fn worker(&self) -> Result<Box<dyn Worker>> {
        Ok(Box::new(MemoryWorker {
            shards: Arc::clone(&self.shards),
        }))
    }
}

struct MemoryWorker {
    shards: Arc<Vec<Mutex<Map>>>,
}

impl MemoryWorker {
    fn insert(&self, key: &Key16, outcome: Option<&[u8]>) -> Result<bool> {
        let mut shard = self.shards[usize::from(key[15]) % SHARDS]
            .lock()
            .map_err(|_| "a memory shard lock is poisoned")?;
        if shard.contains_key(key) {
            return Ok(false);
        }
        shard.insert(*key, outcome.map(Box::from));
        Ok(true)
    }
}

impl Worker for MemoryWorker {
    fn insert_batch(&mut self, keys: &[Key16]) -> Result<usize> {
        let mut new = 0;
        for k in keys {
            new += usize::from(self.insert(k, None)?);
        }
        Ok(new)
    }

    fn begin_complete(&mut self, key: &Key16, outcome: &[u8]) -> Result<bool> {
        self.insert(key, Some(outcome))
    }
}
