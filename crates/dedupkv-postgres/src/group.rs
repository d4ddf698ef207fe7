//! Client-side group commit of `insert`: callers of one instance that
//! insert at the same moment share one multi-row statement (one
//! transaction, one commit, one round trip) instead of each paying its own.
//!
//! A caller queues its key. It leads (takes everything queued, runs it,
//! hands each caller its answer) when no statement is in flight, or when
//! fewer than the set number are and the queue holds its share of the
//! callers waiting (queued ÷ all waiting ≥ 1 ÷ statements in flight at
//! most): statements in flight carry about equal shares instead of the
//! first carrying one key. Otherwise it sleeps until its answer is given,
//! or until a statement's end leaves the queue due to go and it is the
//! oldest queued: then it leads. A lone caller leads at once, so it pays
//! one uncontended lock over the plain path.
//!
//! Invariants: every answer is given after the statement that decided it
//! committed, as without grouping; a failed statement fails each caller
//! it carried; each caller is woken once for its answer (the leader not at
//! all) and at most one queued caller per statement's end to lead; a
//! non-empty queue that is due always has a caller about to take it (the
//! one that made it due, or the oldest, woken by the end that did).

use std::collections::HashMap;
use std::thread::Thread;

use dedupkv::{Error, Key, Result};
use parking_lot::Mutex;

/// One queued insert, by ticket.
struct Queued {
    ticket: u64,
    scope: Vec<u8>,
    id: Vec<u8>,
    retention_ms: i64,
    /// The caller's thread, unparked for its answer or to lead.
    thread: Thread,
}

#[derive(Default)]
struct State {
    /// Inserts no statement has taken yet, in ticket order.
    queue: Vec<Queued>,
    /// Answers not yet collected, by ticket.
    done: HashMap<u64, Result<bool, String>>,
    /// Statements in flight.
    leading: usize,
    /// Inserts the statements in flight carry.
    carried: usize,
    next_ticket: u64,
}

impl State {
    /// Whether the queue should go now, with at most `max` statements in
    /// flight: at once when none is, else when it holds its share (one
    /// `max`th) of the inserts queued or in flight.
    fn due(&self, max: usize) -> bool {
        let queued = self.queue.len();
        queued > 0
            && (self.leading == 0 || (self.leading < max && queued * max >= queued + self.carried))
    }
}

/// The queue one instance's inserts share.
pub(crate) struct Group {
    state: Mutex<State>,
    /// The most statements in flight at once (at least 1).
    max_leading: usize,
}

/// A statement's worth of inserts: keys that share one retention.
pub(crate) struct Run<'a> {
    pub(crate) keys: Vec<Key<'a>>,
    pub(crate) retention_ms: i64,
}

impl Group {
    pub(crate) fn new(max_leading: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            max_leading: max_leading.max(1),
        }
    }

    /// Inserts `key` in a statement shared with concurrent callers;
    /// `run` executes one statement's worth and answers per key, in order.
    pub(crate) fn insert(
        &self,
        key: &Key<'_>,
        retention_ms: i64,
        run: impl Fn(&Run<'_>) -> Result<Vec<bool>>,
    ) -> Result<bool> {
        let mut st = self.state.lock();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.queue.push(Queued {
            ticket,
            scope: key.scope().to_vec(),
            id: key.id().to_vec(),
            retention_ms,
            thread: std::thread::current(),
        });
        loop {
            if let Some(answer) = st.done.remove(&ticket) {
                return answer.map_err(|e| Error::Storage(std::io::Error::other(e).into()));
            }
            let queued = st.queue.first().is_some_and(|q| q.ticket <= ticket);
            if queued && st.due(self.max_leading) {
                let taken = std::mem::take(&mut st.queue);
                st.leading += 1;
                st.carried += taken.len();
                drop(st);
                let mut leading = Leading {
                    group: self,
                    taken,
                    own: ticket,
                    answers: Vec::new(),
                };
                leading.answers = lead(&leading.taken, &run);
                drop(leading);
                st = self.state.lock();
                continue;
            }
            // Woken for an answer, to lead, or spuriously: the loop
            // decides which under the lock.
            drop(st);
            std::thread::park();
            st = self.state.lock();
        }
    }
}

/// A statement in flight: hands its answers over and ends the lead when
/// dropped. Dropped without answers (the statement panicked), it answers
/// each ticket it took with an error, so no caller waits forever.
struct Leading<'g> {
    group: &'g Group,
    taken: Vec<Queued>,
    own: u64,
    answers: Vec<(u64, Result<bool, String>)>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut st = self.group.state.lock();
        st.leading -= 1;
        st.carried -= self.taken.len();
        if self.answers.len() == self.taken.len() {
            st.done.extend(self.answers.drain(..));
        } else {
            for t in self.taken.iter().filter(|q| q.ticket != self.own) {
                st.done.insert(
                    t.ticket,
                    Err("the statement carrying this insert panicked".into()),
                );
            }
        }
        let next = st
            .due(self.group.max_leading)
            .then(|| st.queue.first().map(|q| q.thread.clone()))
            .flatten();
        drop(st);
        for q in self.taken.iter().filter(|q| q.ticket != self.own) {
            q.thread.unpark();
        }
        if let Some(t) = next {
            t.unpark();
        }
    }
}

/// Runs `taken` as one statement per retention and answers each ticket.
fn lead(
    taken: &[Queued],
    run: &impl Fn(&Run<'_>) -> Result<Vec<bool>>,
) -> Vec<(u64, Result<bool, String>)> {
    let mut by_retention: Vec<(i64, Vec<&Queued>)> = Vec::new();
    for q in taken {
        match by_retention.iter_mut().find(|(r, _)| *r == q.retention_ms) {
            Some((_, qs)) => qs.push(q),
            None => by_retention.push((q.retention_ms, vec![q])),
        }
    }
    let mut answers = Vec::with_capacity(taken.len());
    for (retention_ms, qs) in by_retention {
        let keys = qs
            .iter()
            .map(|q| Key::new(q.scope.as_slice(), q.id.as_slice()))
            .collect();
        match run(&Run { keys, retention_ms }) {
            Ok(news) if news.len() == qs.len() => {
                answers.extend(qs.iter().zip(news).map(|(q, n)| (q.ticket, Ok(n))));
            }
            Ok(news) => {
                let e = format!(
                    "a grouped insert answered {} of {} keys",
                    news.len(),
                    qs.len()
                );
                answers.extend(qs.iter().map(|q| (q.ticket, Err(e.clone()))));
            }
            Err(e) => {
                // Each caller's answer is a storage error again: keep the
                // text under this one's "storage: I/O error: ".
                let under = match &e {
                    Error::Storage(s) => std::error::Error::source(s).map(ToString::to_string),
                    _ => None,
                };
                let e = under.unwrap_or_else(|| e.to_string());
                answers.extend(qs.iter().map(|q| (q.ticket, Err(e.clone()))));
            }
        }
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Concurrent callers of one key: exactly one is told new, every
    /// caller gets an answer, and statements carried more than one key.
    #[test]
    fn concurrent_inserts_share_statements_and_one_wins() {
        let group = Arc::new(Group::new(2));
        let seen = Arc::new(Mutex::new(std::collections::HashSet::<Vec<u8>>::new()));
        let statements = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(std::sync::Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let (group, seen, statements, barrier) = (
                    Arc::clone(&group),
                    Arc::clone(&seen),
                    Arc::clone(&statements),
                    Arc::clone(&barrier),
                );
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut won = 0;
                    for i in 0..200u32 {
                        // Every thread inserts the same 100 keys twice.
                        let id = format!("k{}", (i + t) % 100);
                        let run = |r: &Run<'_>| {
                            statements.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(std::time::Duration::from_micros(200));
                            let mut seen = seen.lock();
                            Ok(r.keys
                                .iter()
                                .map(|k| seen.insert(k.id().to_vec()))
                                .collect())
                        };
                        if group.insert(&Key::new("s", id.as_str()), 1, run).unwrap() {
                            won += 1;
                        }
                    }
                    won
                })
            })
            .collect();
        let won: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(won, 100, "each key is new to exactly one caller");
        assert!(
            statements.load(Ordering::Relaxed) < 16 * 200,
            "callers shared statements"
        );
        assert!(group.state.lock().done.is_empty(), "every answer collected");
    }

    /// A failed statement fails every caller it carried, with its message,
    /// and the group goes on serving later callers.
    #[test]
    fn a_failed_statement_fails_its_callers_only() {
        let group = Group::new(1);
        let err = group
            .insert(&Key::new("s", "a"), 1, |_| {
                Err(Error::InvalidConfig("server gone".into()))
            })
            .unwrap_err();
        assert!(err.to_string().contains("server gone"), "{err}");
        assert!(
            group
                .insert(&Key::new("s", "b"), 1, |r| Ok(vec![true; r.keys.len()]))
                .unwrap()
        );
    }

    /// The queue goes at once when nothing is in flight, and beside a
    /// statement in flight only with its share of the waiting inserts.
    #[test]
    fn the_queue_goes_alone_at_once_and_beside_others_with_its_share() {
        let mut st = State::default();
        assert!(!st.due(2), "nothing queued");
        let q = |ticket| Queued {
            ticket,
            scope: b"s".to_vec(),
            id: ticket.to_string().into_bytes(),
            retention_ms: 1,
            thread: std::thread::current(),
        };
        st.queue.push(q(0));
        assert!(st.due(2), "a lone caller leads at once");
        st.leading = 1;
        st.carried = 8;
        st.queue.extend((1..7).map(q));
        assert!(!st.due(2), "7 queued beside 8 in flight: below half");
        st.queue.push(q(7));
        assert!(st.due(2), "8 queued beside 8 in flight: half");
        assert!(!st.due(1), "one in flight at most");
        st.leading = 2;
        assert!(!st.due(2), "two in flight at most");
    }

    /// Keys of different retentions go to different statements, each with
    /// its own retention.
    #[test]
    fn retentions_are_not_mixed() {
        let group = Group::new(1);
        let st = [
            Queued {
                ticket: 0,
                scope: b"s".to_vec(),
                id: b"a".to_vec(),
                retention_ms: 5,
                thread: std::thread::current(),
            },
            Queued {
                ticket: 1,
                scope: b"s".to_vec(),
                id: b"b".to_vec(),
                retention_ms: 7,
                thread: std::thread::current(),
            },
            Queued {
                ticket: 2,
                scope: b"s".to_vec(),
                id: b"c".to_vec(),
                retention_ms: 5,
                thread: std::thread::current(),
            },
        ];
        let runs = Mutex::new(Vec::new());
        let answers = lead(&st, &|r: &Run<'_>| {
            runs.lock().push((
                r.retention_ms,
                r.keys.iter().map(|k| k.id().to_vec()).collect::<Vec<_>>(),
            ));
            Ok(vec![true; r.keys.len()])
        });
        assert_eq!(answers.len(), 3);
        assert_eq!(
            *runs.lock(),
            vec![
                (5, vec![b"a".to_vec(), b"c".to_vec()]),
                (7, vec![b"b".to_vec()])
            ]
        );
        drop(group);
    }
}
