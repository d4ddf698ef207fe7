//! The file's store format: which one it is, what needs a newer one, the
//! upgrade, and the check of every bucket table against its summary.
//!
//! Invariant: the file keeps its format (from format 3 on) unless the
//! operator asks for the upgrade ([`Config::upgrade`](super::Config),
//! [`Engine::upgrade`]); a feature that needs a newer format asks
//! [`Engine::require_format`] first.

use super::Engine;
use crate::records::SUMMARIES_FORMAT;
use crate::{Error, Result};

impl Engine {
    /// The store format of the open file: 3 or 4 for a file an older
    /// build wrote, until [`upgrade`](Self::upgrade); 5 for a new or
    /// upgraded one.
    pub(crate) fn format(&self) -> u32 {
        self.log.format()
    }

    /// The format the engine's own records follow (bodies, counting): the
    /// file's once the open's first commit was made. An upgrade of the
    /// open store changes them from the next open on, so no running
    /// decision (how completions are counted) changes under its callers.
    pub(crate) fn records_format(&self) -> u32 {
        self.log.opened_format()
    }

    /// Fails with [`Error::NeedsUpgrade`] unless the file is at least
    /// format `needed` (its format now, or, `for_records`, the one its
    /// records follow since the open): the one check a feature that writes
    /// or reads something only a newer format has makes before it does.
    pub(crate) fn require_format(
        &self,
        feature: &'static str,
        needed: u32,
        for_records: bool,
    ) -> Result<()> {
        let found = if for_records {
            self.records_format()
        } else {
            self.format()
        };
        if found < needed {
            return Err(Error::NeedsUpgrade {
                feature,
                found,
                needed,
            });
        }
        Ok(())
    }

    /// Rewrites the file as the newest format (format 5: every bucket
    /// table gets its summary) in one commit; whether it was older.
    pub(crate) fn upgrade(&self) -> Result<bool> {
        let upgraded = self.log.upgrade()?;
        if upgraded {
            tracing::info!(
                format = self.format(),
                "dedupkv: the file was upgraded; builds that know only older formats refuse it"
            );
        }
        Ok(upgraded)
    }

    /// Reads every bucket table and checks it against its summary, every
    /// row against its checksum; returns the rows read.
    pub(crate) fn verify(&self) -> Result<u64> {
        self.require_format("Store::verify (bucket summaries)", SUMMARIES_FORMAT, false)?;
        self.log.verify().map_err(|e| match (e, &self.path) {
            (Error::Corrupt(why), Some(p)) => {
                Error::Corrupt(format!("{} is damaged ({why})", p.display()))
            }
            (e, _) => e,
        })
    }
}
