//! Client-side group commit of `insert`: callers of one instance that
//! insert at the same moment share one multi-row statement (one
//! transaction, one commit, one round trip) instead of each paying its own.
//!
//! A caller queues its key and, while fewer than the set number of
//! statements are in flight, leads: it takes everything queued, runs it
//! and hands each caller its answer. Otherwise it waits, and leads itself
//! once a statement finishes with its key still queued. A lone caller
//! leads at once, so it pays one uncontended lock over the plain path.
//! Every answer is given after the statement that decided it committed,
//! as without grouping; a failed statement fails each caller it carried.

use std::collections::HashMap;

use dedupkv::{Error, Key, Result};
use parking_lot::{Condvar, Mutex};

/// One queued insert, by ticket.
struct Queued {
    ticket: u64,
    scope: Vec<u8>,
    id: Vec<u8>,
    retention_ms: i64,
}

#[derive(Default)]
struct State {
    /// Inserts no statement has taken yet, in ticket order.
    queue: Vec<Queued>,
    /// Answers not yet collected, by ticket.
    done: HashMap<u64, Result<bool, String>>,
    /// Statements in flight.
    leading: usize,
    next_ticket: u64,
}

/// The queue one instance's inserts share.
pub(crate) struct Group {
    state: Mutex<State>,
    /// Signalled when a statement finishes.
    finished: Condvar,
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
            finished: Condvar::new(),
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
        });
        loop {
            if let Some(answer) = st.done.remove(&ticket) {
                return answer.map_err(|e| Error::Storage(std::io::Error::other(e).into()));
            }
            let queued = st.queue.first().is_some_and(|q| q.ticket <= ticket);
            if queued && st.leading < self.max_leading {
                st.leading += 1;
                let taken = std::mem::take(&mut st.queue);
                drop(st);
                let mut leading = Leading {
                    group: self,
                    taken: taken.iter().map(|q| q.ticket).collect(),
                    own: ticket,
                    answers: Vec::new(),
                };
                leading.answers = lead(&taken, &run);
                drop(leading);
                st = self.state.lock();
                continue;
            }
            self.finished.wait(&mut st);
        }
    }
}

/// A statement in flight: hands its answers over and ends the lead when
/// dropped. Dropped without answers (the statement panicked), it answers
/// each ticket it took with an error, so no caller waits forever.
struct Leading<'g> {
    group: &'g Group,
    taken: Vec<u64>,
    own: u64,
    answers: Vec<(u64, Result<bool, String>)>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut st = self.group.state.lock();
        st.leading -= 1;
        if self.answers.len() == self.taken.len() {
            st.done.extend(self.answers.drain(..));
        } else {
            for &t in self.taken.iter().filter(|&&t| t != self.own) {
                st.done
                    .insert(t, Err("the statement carrying this insert panicked".into()));
            }
        }
        self.group.finished.notify_all();
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
                let e = e.to_string();
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
            },
            Queued {
                ticket: 1,
                scope: b"s".to_vec(),
                id: b"b".to_vec(),
                retention_ms: 7,
            },
            Queued {
                ticket: 2,
                scope: b"s".to_vec(),
                id: b"c".to_vec(),
                retention_ms: 5,
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
