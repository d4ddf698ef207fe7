//! A runtime-neutral sleep for the async front's timed waits (a waiter's
//! timeout, a lease end): one process-wide thread, `dedupkv-timer`,
//! started on the first timed wait, keeps the deadlines in a heap and
//! wakes each task once when its deadline passes. No runtime is needed
//! and none is assumed; a dropped sleep removes its waker. It uses std's
//! locks rather than `crate::sync`'s: it is a process-wide static outside
//! any store, and the async front is not part of the loom models.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

#[derive(Default)]
struct Timers {
    /// Deadlines, soonest first; an entry whose waker is gone is skipped.
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    wakers: HashMap<u64, Waker>,
    next_id: u64,
}

struct Timer {
    state: Mutex<Timers>,
    changed: Condvar,
}

/// The timer thread's state; the thread is started with it. `None` if
/// the thread could not be started (then a sleep only ends when polled
/// past its deadline, as a caller's own wake-ups allow).
fn timer() -> Option<&'static Timer> {
    static TIMER: OnceLock<Option<Timer>> = OnceLock::new();
    TIMER
        .get_or_init(|| {
            let started = std::thread::Builder::new()
                .name("dedupkv-timer".into())
                .spawn(|| {
                    if let Some(t) = timer() {
                        run(t);
                    }
                });
            match started {
                Ok(_) => Some(Timer {
                    state: Mutex::new(Timers::default()),
                    changed: Condvar::new(),
                }),
                Err(e) => {
                    tracing::error!(error = %e, "dedupkv: the timer thread could not start");
                    None
                }
            }
        })
        .as_ref()
}

fn run(t: &Timer) {
    let mut st = t.state.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(Reverse((at, id))) = st.heap.peek().copied() {
            if at > now {
                break;
            }
            st.heap.pop();
            if let Some(w) = st.wakers.remove(&id) {
                due.push(w);
            }
        }
        if st.wakers.is_empty() {
            st.heap.clear();
        }
        let next = st.heap.peek().map(|Reverse((at, _))| *at);
        if !due.is_empty() {
            drop(st);
            for w in due {
                w.wake();
            }
            st = t.state.lock().unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        st = match next {
            Some(at) => {
                let left = at.saturating_duration_since(now);
                t.changed
                    .wait_timeout(st, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => t.changed.wait(st).unwrap_or_else(PoisonError::into_inner),
        };
    }
}

/// A future that is ready at `deadline` (never, for `None`).
pub(crate) struct Sleep {
    deadline: Option<Instant>,
    id: Option<u64>,
}

impl Sleep {
    pub(crate) fn until(deadline: Option<Instant>) -> Sleep {
        Sleep { deadline, id: None }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(deadline) = self.deadline else {
            return Poll::Pending;
        };
        if Instant::now() >= deadline {
            return Poll::Ready(());
        }
        let Some(t) = timer() else {
            return Poll::Pending;
        };
        let mut st = t.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = self.id
            && let Some(w) = st.wakers.get_mut(&id)
        {
            if !w.will_wake(cx.waker()) {
                w.clone_from(cx.waker());
            }
            return Poll::Pending;
        }
        st.next_id += 1;
        let id = st.next_id;
        let soonest = st.heap.peek().is_none_or(|Reverse((at, _))| deadline < *at);
        st.heap.push(Reverse((deadline, id)));
        st.wakers.insert(id, cx.waker().clone());
        drop(st);
        self.id = Some(id);
        if soonest {
            t.changed.notify_one();
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let (Some(id), Some(t)) = (self.id, timer()) {
            t.state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .wakers
                .remove(&id);
        }
    }
}
