//! Key-level reconciliation: the keys a scope's windows kept, matched with
//! the keys the system of record lists per window.
//!
//! How a boundary is judged: an operation's window is the store's time
//! when it completed; the system of record buckets by its own clock (when
//! it accepted the call, usually a little earlier). A key it lists in one
//! window that the store completed in the next (or the one before) is
//! matched there, once, when the store's completion lies within the
//! settle margin of the boundary between them: reported as `straddled`,
//! never as missing in one window and extra in the other. Same-window
//! matches are made first, so a straddle never takes a key a window
//! matches itself. A key the store completed within the margin of a
//! boundary whose other window the call did not give cannot be judged:
//! `unsettled`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::Engine;
use super::reconcile::Counting;
use crate::clock::to_system_time;
use crate::types::{KeyKind, KeyReconciliation, KeyWindowDiff, WindowKeys};
use crate::{Error, Result};

/// One operation the store completed: its window start, completion time,
/// and whether a key of theirs matched it.
struct Ours {
    start: u64,
    at: u64,
    matched: bool,
}

/// Their keys by window start.
type Theirs = BTreeMap<u64, Vec<Vec<u8>>>;

impl Engine {
    /// Compares the keys `scope` kept with `theirs`, window by window,
    /// matching across a boundary within `settle`.
    pub(crate) fn reconcile_keys(
        &self,
        scope: &[u8],
        theirs: &[WindowKeys],
        settle: Duration,
    ) -> Result<KeyReconciliation> {
        self.check_keys_scope(scope)?;
        let window = self.config().tally_window_ms;
        let settle = u64::try_from(settle.as_millis()).unwrap_or(u64::MAX);
        if settle > window {
            return Err(Error::InvalidArgument {
                what: "settle",
                reason: format!(
                    "is {settle} ms, longer than the {window} ms reconcile window: a key is \
                     matched across one boundary at most"
                ),
            });
        }
        let (kind, their) = self.their_keys(theirs)?;
        let (Some(&first), Some(&last)) = (their.keys().next(), their.keys().next_back()) else {
            return Ok(KeyReconciliation {
                windows: Vec::new(),
            });
        };
        let mut ours: HashMap<Vec<u8>, Vec<Ours>> = HashMap::new();
        let span = first.saturating_sub(window)..=last.saturating_add(window);
        for (start, id, provider_key, at) in self.keys_of(scope, span) {
            let key = match kind {
                KeyKind::ProviderKey => format!("{provider_key:032x}").into_bytes(),
                _ => id,
            };
            ours.entry(key).or_default().push(Ours {
                start,
                at,
                matched: false,
            });
        }
        let mut m = Matching {
            window,
            settle,
            their: &their,
            ours,
            diffs: BTreeMap::new(),
        };
        m.match_theirs();
        m.judge_ours(first..=last);
        Ok(KeyReconciliation {
            windows: m
                .diffs
                .into_values()
                .map(|mut d| {
                    for list in [
                        &mut d.missing,
                        &mut d.extra,
                        &mut d.straddled,
                        &mut d.unsettled,
                    ] {
                        list.sort_unstable();
                    }
                    d
                })
                .collect(),
        })
    }

    /// Fails unless `scope` keeps keys.
    fn check_keys_scope(&self, scope: &[u8]) -> Result<()> {
        self.check_tally_scope(scope)?;
        if self.counting() == Counting::Legacy {
            self.require_format(
                "reconciling keys (kept keys; an upgrade of the open store takes effect at \
                 its next open)",
                crate::records::BODIES_FORMAT,
                true,
            )?;
        }
        if !self.keeps_keys(scope) {
            return Err(Error::InvalidArgument {
                what: "scope",
                reason: format!(
                    "{:?} keeps no keys: name it with StoreBuilder::reconcile_keys_of",
                    String::from_utf8_lossy(scope)
                ),
            });
        }
        Ok(())
    }

    /// `theirs` by window start (entries of one window add up), and the
    /// kind of key they are.
    fn their_keys(&self, theirs: &[WindowKeys]) -> Result<(KeyKind, Theirs)> {
        let kind = theirs.first().map_or(KeyKind::Id, |w| w.kind);
        let mut their = Theirs::new();
        for w in theirs {
            let start = self.window_start_ms("window_keys", w.window_start)?;
            if w.kind != kind {
                return Err(Error::InvalidArgument {
                    what: "window_keys",
                    reason: "mixes ids and provider keys: give one kind per call".into(),
                });
            }
            their
                .entry(start)
                .or_default()
                .extend(w.keys.iter().map(|k| normalized(kind, k)));
        }
        Ok((kind, their))
    }
}

/// One matching of their keys with ours.
struct Matching<'a> {
    window: u64,
    settle: u64,
    their: &'a Theirs,
    ours: HashMap<Vec<u8>, Vec<Ours>>,
    diffs: BTreeMap<u64, KeyWindowDiff>,
}

impl Matching<'_> {
    fn diff(&mut self, start: u64) -> &mut KeyWindowDiff {
        self.diffs.entry(start).or_insert_with(|| KeyWindowDiff {
            window_start: to_system_time(start),
            matched: 0,
            missing: Vec::new(),
            extra: Vec::new(),
            straddled: Vec::new(),
            unsettled: Vec::new(),
        })
    }

    /// Matches each of their keys with one of ours: in its own window
    /// first (every window), then across a boundary within the margin.
    fn match_theirs(&mut self) {
        let (window, settle, their) = (self.window, self.settle, self.their);
        let mut left: Vec<(u64, &[u8])> = Vec::new();
        for (&start, keys) in their {
            self.diff(start);
            for k in keys {
                let found = self
                    .ours
                    .get_mut(k)
                    .and_then(|o| o.iter_mut().find(|o| !o.matched && o.start == start));
                if let Some(o) = found {
                    o.matched = true;
                    self.diff(start).matched += 1;
                } else {
                    left.push((start, k));
                }
            }
        }
        for (start, k) in left {
            let next = start.saturating_add(window);
            let across = self.ours.get_mut(k).and_then(|o| {
                o.iter_mut().find(|o| {
                    !o.matched
                        && ((o.start == next && o.at < next.saturating_add(settle))
                            || (o.start.saturating_add(window) == start
                                && o.at >= start.saturating_sub(settle)))
                })
            });
            let matched = across.map(|o| o.matched = true).is_some();
            let d = self.diff(start);
            if matched {
                d.matched += 1;
                d.straddled.push(k.to_vec());
            } else {
                d.extra.push(k.to_vec());
            }
        }
    }

    /// Judges each of our operations in `starts` that none of their keys
    /// matched: missing, or unsettled if it lies within the margin of a
    /// boundary whose other window they did not give.
    fn judge_ours(&mut self, starts: std::ops::RangeInclusive<u64>) {
        let (window, settle) = (self.window, self.settle);
        let mut judged: Vec<(u64, Vec<u8>, bool)> = Vec::new();
        for (k, occurrences) in &self.ours {
            for o in occurrences {
                if o.matched || !starts.contains(&o.start) {
                    continue;
                }
                let near_start = o.at < o.start.saturating_add(settle);
                let near_end = o.at >= o.start.saturating_add(window).saturating_sub(settle);
                let given = |s: u64| self.their.contains_key(&s);
                let unsettled = (near_start && !given(o.start.saturating_sub(window)))
                    || (near_end && !given(o.start.saturating_add(window)));
                judged.push((o.start, k.clone(), unsettled));
            }
        }
        for (start, k, unsettled) in judged {
            let d = self.diff(start);
            if unsettled {
                d.unsettled.push(k);
            } else {
                d.missing.push(k);
            }
        }
    }
}

/// A key of theirs as the store's side spells it: provider keys in
/// lowercase hex (one that is no provider key stays as it is, and matches
/// nothing).
fn normalized(kind: KeyKind, key: &[u8]) -> Vec<u8> {
    match kind {
        KeyKind::ProviderKey if key.len() == 32 && key.iter().all(u8::is_ascii_hexdigit) => {
            key.to_ascii_lowercase()
        }
        _ => key.to_vec(),
    }
}
