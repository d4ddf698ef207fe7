//! Key-level reconciliation: the keys a scope's windows kept, matched with
//! the keys the system of record lists per window — one matching for every
//! backend ([`reconcile_keys`]), over the completions it kept.
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
use std::ops::RangeInclusive;
use std::time::{Duration, SystemTime};

use super::window_start;
use crate::clock::{to_ms, to_system_time};
use crate::types::{KeyKind, KeyReconciliation, KeyWindowDiff, WindowKeys};
use crate::{Error, Result};

/// One operation a backend completed, as it keeps it for key
/// reconciliation: its window, id, provider key and completion time.
///
/// # Examples
/// ```
/// use dedupkv::contract::Completion;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let hour = UNIX_EPOCH + Duration::from_secs(3600);
/// let c = Completion::new(hour, b"o1".to_vec(), 7, hour + Duration::from_secs(5));
/// assert_eq!(c.id, b"o1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completion {
    /// The start of the window it counts in.
    pub window_start: SystemTime,
    /// The operation's id (its key's id).
    pub id: Vec<u8>,
    /// The operation's provider key.
    pub provider_key: u128,
    /// When it completed.
    pub at: SystemTime,
}

impl Completion {
    /// A completion (for a backend outside the crate).
    ///
    /// # Examples
    /// See [`Completion`].
    #[must_use]
    pub fn new(window_start: SystemTime, id: Vec<u8>, provider_key: u128, at: SystemTime) -> Self {
        Completion {
            window_start,
            id,
            provider_key,
            at,
        }
    }
}

/// Matches the completions a backend kept with `theirs`, window by window
/// (windows of `window`), across a boundary within `settle`; `ours` gives
/// the backend's completions whose windows start in the range asked
/// (ms since the epoch: one window either side of theirs).
///
/// # Errors
/// [`Error::InvalidArgument`] for a `settle` longer than the window, a
/// window of theirs off the grid, or ids and provider keys mixed; those
/// of `ours`.
///
/// # Examples
/// ```
/// use dedupkv::contract::{reconcile_keys, Completion};
/// use dedupkv::WindowKeys;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// let hour = Duration::from_secs(3600);
/// let w = UNIX_EPOCH + hour;
/// let ours = vec![Completion::new(w, b"o1".to_vec(), 1, w + Duration::from_secs(60))];
/// let theirs = [WindowKeys::ids(w, [b"o1".to_vec(), b"o2".to_vec()])];
/// let report = reconcile_keys(hour, Duration::ZERO, &theirs, |_| Ok(ours.clone()))?;
/// assert_eq!(report.windows[0].extra, vec![b"o2".to_vec()]);
/// # Ok::<(), dedupkv::Error>(())
/// ```
pub fn reconcile_keys(
    window: Duration,
    settle: Duration,
    theirs: &[WindowKeys],
    ours: impl FnOnce(RangeInclusive<u64>) -> Result<Vec<Completion>>,
) -> Result<KeyReconciliation> {
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    let settle = u64::try_from(settle.as_millis()).unwrap_or(u64::MAX);
    if settle > window_ms {
        return Err(Error::InvalidArgument {
            what: "settle",
            reason: format!(
                "is {settle} ms, longer than the {window_ms} ms reconcile window: a key is \
                 matched across one boundary at most"
            ),
        });
    }
    let (kind, their) = their_keys(window, theirs)?;
    let (Some(&first), Some(&last)) = (their.keys().next(), their.keys().next_back()) else {
        return Ok(KeyReconciliation {
            windows: Vec::new(),
        });
    };
    let mut kept: HashMap<Vec<u8>, Vec<Ours>> = HashMap::new();
    let span = first.saturating_sub(window_ms)..=last.saturating_add(window_ms);
    for c in ours(span)? {
        let key = match kind {
            KeyKind::ProviderKey => format!("{:032x}", c.provider_key).into_bytes(),
            _ => c.id,
        };
        kept.entry(key).or_default().push(Ours {
            start: to_ms(c.window_start),
            at: to_ms(c.at),
            matched: false,
        });
    }
    let mut m = Matching {
        window: window_ms,
        settle,
        their: &their,
        ours: kept,
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

/// `theirs` by window start (entries of one window add up), and the kind
/// of key they are.
fn their_keys(window: Duration, theirs: &[WindowKeys]) -> Result<(KeyKind, Theirs)> {
    let kind = theirs.first().map_or(KeyKind::Id, |w| w.kind);
    let mut their = Theirs::new();
    for w in theirs {
        let start = window_start(window, "window_keys", w.window_start)?;
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

/// One operation the store completed: its window start, completion time,
/// and whether a key of theirs matched it.
struct Ours {
    start: u64,
    at: u64,
    matched: bool,
}

/// Their keys by window start.
type Theirs = BTreeMap<u64, Vec<Vec<u8>>>;

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
