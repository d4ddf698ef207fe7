//! dedupkv itself, in its two durability modes.

use std::time::Duration;

use dedupkv::{Begin, Durability, Fingerprint, Key, Store};
use tempfile::TempDir;

use crate::contender::{Contender, Instance, Key16, Result, SCOPE, Worker};

/// dedupkv with a given [`Durability`], with or without its journal.
pub struct Dedupkv {
    durability: Durability,
    /// With the journal (the builder's default: 16 MiB); else
    /// `journal(None)`, redb only.
    journal: bool,
}

impl Dedupkv {
    /// Acknowledge after fdatasync.
    pub fn immediate() -> Self {
        Self {
            durability: Durability::Immediate,
            journal: false,
        }
    }

    /// Acknowledge after fdatasync of a record in the journal in front
    /// of the file (the default journal: 16 MiB).
    pub fn journal() -> Self {
        Self {
            durability: Durability::Immediate,
            journal: true,
        }
    }

    /// Acknowledge at once, commit within 10 ms.
    pub fn deferred_10ms() -> Self {
        Self {
            durability: Durability::Deferred {
                max_delay: Duration::from_millis(10),
            },
            journal: false,
        }
    }
}

impl Contender for Dedupkv {
    fn id(&self) -> &'static str {
        if self.journal {
            return "dedupkv-journal";
        }
        match self.durability {
            Durability::Immediate => "dedupkv-immediate",
            _ => "dedupkv-deferred",
        }
    }

    fn name(&self) -> String {
        if self.journal {
            return "dedupkv Immediate + journal".into();
        }
        match self.durability {
            Durability::Immediate => "dedupkv Immediate".into(),
            Durability::Deferred { max_delay } => {
                format!("dedupkv Deferred {} ms", max_delay.as_millis())
            }
            _ => format!("dedupkv {:?}", self.durability),
        }
    }

    fn durability(&self) -> &'static str {
        match self.durability {
            Durability::Immediate => "durable: fdatasync before ack",
            _ => "relaxed durability: a crash loses up to 10 ms of acks",
        }
    }

    fn open(&self, expected_keys: usize) -> Result<Box<dyn Instance>> {
        let dir = tempfile::tempdir()?;
        let builder = Store::builder()
            .durability(self.durability)
            .expected_keys(expected_keys);
        // The journal contender takes the builder's default (what a user
        // gets); the others turn it off.
        let builder = if self.journal {
            builder
        } else {
            builder.journal(None)
        };
        let store = builder.open(dir.path().join("bench.redb"))?;
        Ok(Box::new(DedupkvInstance { store, _dir: dir }))
    }
}

struct DedupkvInstance {
    store: Store,
    // Dropped after the store (field order), removing the file.
    _dir: TempDir,
}

impl Instance for DedupkvInstance {
    fn worker(&self) -> Result<Box<dyn Worker>> {
        Ok(Box::new(DedupkvWorker {
            store: self.store.clone(),
        }))
    }

    fn finish(&self) -> Result<()> {
        Ok(self.store.flush()?)
    }
}

struct DedupkvWorker {
    store: Store,
}

impl Worker for DedupkvWorker {
    fn insert_batch(&mut self, keys: &[Key16]) -> Result<usize> {
        if let [key] = keys {
            return Ok(usize::from(
                self.store.insert_if_absent(&Key::new(SCOPE, key))?,
            ));
        }
        let keys: Vec<Key<'_>> = keys.iter().map(|k| Key::new(SCOPE, k)).collect();
        let new = self.store.insert_batch(&keys)?;
        Ok(new.iter().filter(|&&n| n).count())
    }

    fn begin_complete(&mut self, key: &Key16, outcome: &[u8]) -> Result<bool> {
        match self.store.begin(&Key::new(SCOPE, key), Fingerprint::NONE)? {
            Begin::Started(claim) => {
                self.store.complete(&claim, outcome)?;
                Ok(true)
            }
            // Finished by an earlier op, or being run by another worker now.
            Begin::Completed(_) | Begin::InProgress(_) | Begin::DeadLettered(_) => Ok(false),
        }
    }
}
