//! Reconciliation as index data: per scope and window, the count and
//! amount sum of completed operations and, for a scope that keeps them,
//! their keys.
//!
//! Two places, so that a completion takes no store-wide lock:
//! - [`ShardTallies`], in each shard under the shard's lock: the windows
//!   the shard's completions counted since the last fold (usually one per
//!   scope);
//! - [`Tallies`], one map behind its own mutex: the windows folded out of
//!   the shards, and what recovery found.
//!
//! A window's totals are the sum of both places. Moving a window from a
//! shard to the map (a fold) and reading both places happen under one
//! more mutex, the fold lock, so a read never sees a window in both
//! places or in neither. Lock order: fold lock, shard locks (ascending),
//! the log's batch lock, the map.

use std::collections::BTreeMap;

/// A window's count and amount sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub count: u64,
    pub sum: i128,
}

impl Totals {
    pub(crate) fn add(&mut self, other: Totals) {
        self.count = self.count.saturating_add(other.count);
        self.sum = self.sum.saturating_add(other.sum);
    }
}

/// Keys of completed operations, packed: the ids back to back, and per
/// key its provider key, completion time and where its id ends. 32 bytes
/// per key besides its id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Keys {
    ids: Vec<u8>,
    entries: Vec<KeyEntry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyEntry {
    provider_key: [u8; 16],
    at: u64,
    end: usize,
}

/// One key of a [`Keys`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyRef<'a> {
    pub id: &'a [u8],
    pub provider_key: u128,
    /// When the operation completed (the store's time, ms).
    pub at: u64,
}

impl Keys {
    pub(crate) fn push(&mut self, id: &[u8], provider_key: u128, at: u64) {
        self.ids.extend_from_slice(id);
        self.entries.push(KeyEntry {
            provider_key: provider_key.to_le_bytes(),
            at,
            end: self.ids.len(),
        });
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Moves every key of `other` in.
    pub(crate) fn append(&mut self, other: Keys) {
        if self.entries.is_empty() {
            *self = other;
            return;
        }
        let base = self.ids.len();
        self.ids.extend_from_slice(&other.ids);
        self.entries
            .extend(other.entries.into_iter().map(|e| KeyEntry {
                end: e.end + base,
                ..e
            }));
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = KeyRef<'_>> {
        self.entries.iter().scan(0, |start, e| {
            let id = &self.ids[*start..e.end];
            *start = e.end;
            Some(KeyRef {
                id,
                provider_key: u128::from_le_bytes(e.provider_key),
                at: e.at,
            })
        })
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.ids.capacity() + self.entries.capacity() * std::mem::size_of::<KeyEntry>()
    }
}

/// One window of one scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Window {
    /// Its length in ms.
    pub length_ms: u64,
    pub totals: Totals,
    /// The completed operations' keys, for a scope that keeps them.
    pub keys: Option<Keys>,
}

impl Window {
    pub(crate) fn new(window_ms: u64, keeps_keys: bool) -> Window {
        Window {
            length_ms: window_ms,
            totals: Totals::default(),
            keys: keeps_keys.then(Keys::default),
        }
    }

    /// Adds `other`'s totals and keys.
    pub(crate) fn merge(&mut self, other: Window) {
        self.totals.add(other.totals);
        match (&mut self.keys, other.keys) {
            (Some(mine), Some(theirs)) => mine.append(theirs),
            (mine @ None, Some(theirs)) => *mine = Some(theirs),
            (_, None) => {}
        }
    }
}

/// The store-wide windows, by scope, then window start.
pub(crate) type Tallies = BTreeMap<Vec<u8>, BTreeMap<u64, Window>>;

/// A shard's windows not folded yet: by scope (found by borrow, so the
/// scope is copied only when a shard first counts it), then start.
#[derive(Debug, Default)]
pub(crate) struct ShardTallies {
    scopes: BTreeMap<Vec<u8>, Vec<(u64, Window)>>,
}

impl ShardTallies {
    /// The window of `scope` starting at `start`, created (of length
    /// `window_ms`, keeping keys if `keeps_keys` says so) if new.
    #[inline]
    pub(crate) fn window(
        &mut self,
        scope: &[u8],
        start: u64,
        window_ms: u64,
        keeps_keys: impl FnOnce() -> bool,
    ) -> &mut Window {
        if !self.scopes.contains_key(scope) {
            self.scopes.insert(scope.to_vec(), Vec::new());
        }
        let windows = self.scopes.get_mut(scope).expect("inserted above");
        let i = if let Some(i) = windows.iter().rposition(|(s, _)| *s == start) {
            i
        } else {
            windows.push((start, Window::new(window_ms, keeps_keys())));
            windows.len() - 1
        };
        &mut windows[i].1
    }

    /// Takes out every window that starts before `start`.
    pub(crate) fn take_before(&mut self, start: u64, out: &mut Vec<(Vec<u8>, u64, Window)>) {
        if self
            .scopes
            .values()
            .all(|windows| windows.iter().all(|(s, _)| *s >= start))
        {
            return;
        }
        self.scopes.retain(|scope, windows| {
            let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(windows)
                .into_iter()
                .partition(|(s, _)| *s < start);
            out.extend(old.into_iter().map(|(s, w)| (scope.clone(), s, w)));
            *windows = keep;
            !windows.is_empty()
        });
    }

    /// The window of `scope` starting at `start`, if counted here.
    pub(crate) fn get(&self, scope: &[u8], start: u64) -> Option<&Window> {
        self.scopes
            .get(scope)?
            .iter()
            .find(|(s, _)| *s == start)
            .map(|(_, w)| w)
    }

    /// Every window of `scope` counted here.
    pub(crate) fn of(&self, scope: &[u8]) -> impl Iterator<Item = (u64, &Window)> {
        self.scopes
            .get(scope)
            .into_iter()
            .flatten()
            .map(|(s, w)| (*s, w))
    }

    /// Keys held, and heap bytes.
    pub(crate) fn usage(&self) -> (usize, usize) {
        self.scopes.iter().fold((0, 0), |acc, (scope, windows)| {
            windows.iter().fold(
                (acc.0, acc.1 + scope.capacity() + windows.capacity() * 96),
                |(k, b), (_, w)| {
                    let (n, h) = w
                        .keys
                        .as_ref()
                        .map_or((0, 0), |k| (k.len(), k.heap_bytes()));
                    (k + n, b + h)
                },
            )
        })
    }
}

/// Keys held, and heap bytes, of the store-wide windows.
pub(crate) fn usage(t: &Tallies) -> (usize, usize) {
    t.iter().fold((0, 0), |acc, (scope, windows)| {
        windows.values().fold(
            (acc.0, acc.1 + scope.capacity() + windows.len() * 128),
            |(k, b), w| {
                let (n, h) = w
                    .keys
                    .as_ref()
                    .map_or((0, 0), |k| (k.len(), k.heap_bytes()));
                (k + n, b + h)
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_in_order_across_an_append() {
        let mut a = Keys::default();
        a.push(b"o1", 7, 100);
        a.push(b"", 8, 101);
        let mut b = Keys::default();
        b.push(b"order-3", u128::MAX, 102);
        a.append(b);
        let got: Vec<_> = a.iter().map(|k| (k.id, k.provider_key, k.at)).collect();
        assert_eq!(
            got,
            vec![
                (&b"o1"[..], 7, 100),
                (&b""[..], 8, 101),
                (&b"order-3"[..], u128::MAX, 102)
            ]
        );
        assert_eq!(std::mem::size_of::<KeyEntry>(), 32);
    }

    #[test]
    fn a_fold_takes_the_older_windows_and_drops_empty_scopes() {
        let mut t = ShardTallies::default();
        t.window(b"s", 0, 10, || false).totals.count += 1;
        t.window(b"s", 10, 10, || false).totals.count += 2;
        t.window(b"u", 0, 10, || true).totals.count += 3;
        let mut out = Vec::new();
        t.take_before(10, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(t.get(b"s", 10).map(|w| w.totals.count), Some(2));
        assert!(t.get(b"u", 0).is_none());
        assert_eq!(t.of(b"u").count(), 0);
    }
}
