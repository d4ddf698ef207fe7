//! Opening the store: read-only for every read (never a byte written,
//! never a lock that blocks the live writer), writable only for a command
//! given `--write`; each failure a message naming the path.

use std::path::Path;

use dedupkv::{Error, Key, Store};

/// Opens `path` read-only; nothing is created when it is missing.
pub fn read_only(path: &Path) -> Result<Store, String> {
    Store::open_read_only(path).map_err(|e| named(path, &e))
}

/// Opens `path` read-only for reads of `key` alone: the index holds that
/// key only (`StoreBuilder::open_read_only_key`).
pub fn read_only_key(path: &Path, key: &Key<'_>) -> Result<Store, String> {
    Store::builder()
        .open_read_only_key(path, key)
        .map_err(|e| named(path, &e))
}

/// Opens the existing store at `path` writable (never creates one): for
/// a write when no live endpoint answers beside it.
pub fn writable(path: &Path) -> Result<Store, String> {
    if !path.is_file() {
        return Err(format!(
            "{}: no store file there (offline writes never create one)",
            path.display()
        ));
    }
    Store::open_existing(path).map_err(|e| match e {
        Error::AlreadyOpen => format!(
            "{}: the store is open in another process (AlreadyOpen); an offline write needs \
             it closed, or that process's live admin endpoint: serve one with \
             StoreBuilder::admin_socket(AdminOptions::new().allow_writes(true))",
            path.display()
        ),
        e => named(path, &e),
    })
}

/// `e`'s message, with the path first unless it names it already.
pub fn named(path: &Path, e: &Error) -> String {
    let msg = e.to_string();
    let shown = path.display().to_string();
    if msg.contains(&shown) {
        msg
    } else {
        format!("{shown}: {msg}")
    }
}
