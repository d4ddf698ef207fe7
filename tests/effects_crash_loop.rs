//! A poison message under real SIGKILLs: a child process takes the
//! operation through a runner (`RetryPolicy::run`, or `RetryPolicy::call`
//! with a provider to ask) and freezes inside the work; the test kills it
//! there and starts it again, every time. With `max_attempts(3)` the work
//! is called exactly three times across the kills, the fourth life finds
//! the limit before calling and dead-letters the operation with a reason
//! that says so, every later life answers the dead letter, and a
//! `requeue` grants exactly one more round.
//!
//! Built without the test harness (`tests/child`): this binary is the child
//! when `DEDUPKV_CRASH_LOOP_PATH` is set, and runs the tests otherwise.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Duration;

use dedupkv::{
    Answer, Effect, ErrorClass, Fingerprint, Intent, Key, Listing, Result, RetryPolicy, Run, Store,
};
use dedupkv_testkit::tempdir;

mod child;

const PATH_ENV: &str = "DEDUPKV_CRASH_LOOP_PATH";
const MODE_ENV: &str = "DEDUPKV_CRASH_LOOP_MODE";
const MAX_ATTEMPTS: u32 = 3;
const REQUEST: &[u8] = b"ship order 13: 1 parcel to 1 Poison Road";
const EXHAUSTED: &str = "interrupted 3 times (max_attempts); attempt 4 not started";

fn main() -> ExitCode {
    child::main(
        PATH_ENV,
        crash_child,
        &[
            (
                "run_calls_the_work_max_attempts_times_across_kills",
                run_calls_the_work_max_attempts_times_across_kills,
            ),
            (
                "call_sends_max_attempts_times_across_kills",
                call_sends_max_attempts_times_across_kills,
            ),
            ("nothing_passes_under_ignored", nothing_passes_under_ignored),
        ],
    )
}

fn key() -> Key<'static> {
    Key::new("orders", "13")
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("stdout");
    out.flush().expect("flush");
}

/// Says what it is about to do inside the work, then freezes there: the
/// test kills the process at this point.
fn freeze(what: &str, claim: &dedupkv::Claim) -> ! {
    say(&format!("{what} {}", claim.attempt()));
    loop {
        std::thread::park();
    }
}

/// The child: one delivery of the poison message through the runner the
/// mode names; prints the runner's answer if the work did not freeze.
fn crash_child() {
    let store = Store::open(child::env(PATH_ENV)).expect("open");
    let policy = RetryPolicy::builder()
        .max_attempts(MAX_ATTEMPTS)
        .build()
        .expect("policy");
    let classify = |_: &String| ErrorClass::Retryable;
    let fp = Fingerprint::of(REQUEST);
    say("READY");
    let run = match child::env(MODE_ENV).as_str() {
        "run" => policy.run(&store, &key(), fp, classify, |claim| {
            freeze("CALLED", claim)
        }),
        "call" => {
            let intent = Intent {
                target: "carrier",
                request: REQUEST,
            };
            let lookup = |claim: &dedupkv::Claim| {
                say(&format!("ASKED {}", claim.attempt()));
                Ok(None) // the poison call never reached the carrier
            };
            let effect = Effect::new(intent, lookup, |claim| freeze("CALLED", claim), classify);
            policy.call(&store, &key(), fp, effect)
        }
        other => panic!("mode {other}"),
    }
    .expect("runner");
    match run {
        Run::Exhausted {
            attempt, reason, ..
        } => say(&format!("EXHAUSTED {attempt} {reason}")),
        Run::DeadLettered(dl) => say(&format!("DEAD {}", dl.reason())),
        other => say(&format!("OTHER {other:?}")),
    }
}

/// This binary with the child's environment removed.
fn this_binary() -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.env_remove(PATH_ENV).env_remove(MODE_ENV);
    cmd
}

/// What one life of the child did.
#[derive(Debug, PartialEq, Eq)]
enum Life {
    /// It called the work in attempt n, and was killed there.
    Killed(u32),
    /// It answered, having called no work (what it printed).
    Answered(String),
}

/// One life: starts the child, and kills it if it calls the work. The
/// lookups it made are added to `asked`.
fn live(path: &Path, mode: &str, asked: &mut Vec<u32>) -> Life {
    let mut spawned = child::Spawned::start(this_binary().env(PATH_ENV, path).env(MODE_ENV, mode));
    spawned.wait_ready(Duration::from_secs(60));
    loop {
        let line = spawned
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("the child said nothing more: {e}"));
        if let Some(n) = line.strip_prefix("ASKED ") {
            asked.push(n.parse().expect("attempt"));
        } else if let Some(n) = line.strip_prefix("CALLED ") {
            spawned.child.kill().expect("SIGKILL");
            assert!(!spawned.child.wait().expect("wait").success());
            assert!(spawned.rest().is_empty(), "frozen inside the work");
            return Life::Killed(n.parse().expect("attempt"));
        } else {
            assert!(spawned.child.wait().expect("wait").success());
            assert!(spawned.rest().is_empty());
            return Life::Answered(line);
        }
    }
}

/// Lives until the child answers instead of calling the work: the
/// attempts in which it was killed, and its answer.
fn until_answered(path: &Path, mode: &str, asked: &mut Vec<u32>) -> (Vec<u32>, String) {
    let mut killed = Vec::new();
    for _ in 0..2 * MAX_ATTEMPTS + 2 {
        match live(path, mode, asked) {
            Life::Killed(n) => killed.push(n),
            Life::Answered(line) => return (killed, line),
        }
    }
    panic!("{mode}: the work was called past max_attempts: killed in attempts {killed:?}");
}

/// The crash loop against `mode`'s runner, then a requeue and another.
fn crash_loop(mode: &str) -> Result<Vec<u32>> {
    let dir = tempdir();
    let path = dir.path().join("loop.redb");
    let mut asked = Vec::new();
    let (killed, answer) = until_answered(&path, mode, &mut asked);
    assert_eq!(
        killed,
        [1, 2, 3],
        "{mode}: the work is called once per attempt, 3 in all"
    );
    assert_eq!(
        answer,
        format!(
            "EXHAUSTED 4 {}",
            &EXHAUSTED[..EXHAUSTED.find(';').expect(";")]
        )
    );
    // Every later delivery finds the dead letter: no call, no new attempt.
    for _ in 0..2 {
        assert_eq!(
            live(&path, mode, &mut asked),
            Life::Answered(format!("DEAD {EXHAUSTED}"))
        );
    }
    {
        let store = Store::open(&path)?;
        let page = store.dead_letters(&Listing::new())?;
        let [dl] = &page.items[..] else {
            panic!("{mode}: dead letters {:?}", page.items)
        };
        assert_eq!(dl.key(), &key());
        assert_eq!(dl.reason(), EXHAUSTED);
        assert_eq!(dl.attempts(), 4, "three made, the fourth checked the limit");
        if mode == "call" {
            assert_eq!(dl.payload(), Some(REQUEST), "the request, for the operator");
            // The fourth life asked the carrier before the dead letter:
            // the killed calls never reached it, and that is recorded.
            let pending = store.pending_intents(&Listing::new())?;
            assert!(pending.items.is_empty(), "{:?}", pending.items);
            let intent = store.intent(&key())?.expect("recorded");
            assert_eq!(intent.answer(), Some(Answer::NotFound));
        }
        // The operator requeues it: exactly one more round.
        assert!(store.requeue(&key())?);
    }
    let (killed, answer) = until_answered(&path, mode, &mut asked);
    assert_eq!(killed, [5, 6, 7], "{mode}: another round of three");
    assert!(
        answer.starts_with("EXHAUSTED 8 interrupted 3 times"),
        "{answer}"
    );
    Ok(asked)
}

fn run_calls_the_work_max_attempts_times_across_kills() -> Result<()> {
    let asked = crash_loop("run")?;
    assert!(asked.is_empty(), "run has no provider to ask");
    Ok(())
}

fn call_sends_max_attempts_times_across_kills() -> Result<()> {
    let asked = crash_loop("call")?;
    // Each takeover asks the carrier before calling again, and so does the
    // first claim past the limit (to settle the killed call before the
    // dead letter); the first attempt after the requeue finds that
    // settled, and does not ask.
    assert_eq!(asked, [2, 3, 4, 6, 7, 8]);
    Ok(())
}

/// The child is not a test entry: run with `--ignored`, this binary passes
/// nothing.
#[allow(clippy::unnecessary_wraps)] // the signature of a `child::Test`
fn nothing_passes_under_ignored() -> Result<()> {
    child::nothing_passes_under_ignored(this_binary());
    Ok(())
}
