//! The runners with async work (`run_async`, `call_async`): the same
//! steps and answers as `run` and `call`, the work awaited between them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dedupkv::{
    AsyncStore, Effect, ErrorClass, Fingerprint, Intent, Key, Result, RetryPolicy, Run, Store,
};
use dedupkv_testkit::tempdir;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn run_async_records_the_outcome_and_replays_it() -> Result<()> {
    let dir = tempdir();
    let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    let policy = RetryPolicy::new();
    let key = Key::new("t", "op");
    let transient = |_: &String| ErrorClass::Retryable;
    runtime().block_on(async {
        let first = policy
            .run_async(&store, &key, Fingerprint::NONE, transient, |_| async {
                Err("timeout".to_string())
            })
            .await?;
        assert!(matches!(first, Run::RetryAfter { attempt: 1, .. }));
        let done = policy
            .run_async(&store, &key, Fingerprint::NONE, transient, |claim| {
                let attempt = claim.attempt();
                async move {
                    tokio::task::yield_now().await;
                    Ok(format!("done by {attempt}").into_bytes())
                }
            })
            .await?;
        assert!(matches!(done, Run::Done(ref o) if o == b"done by 2"));
        let again = policy
            .run_async(&store, &key, Fingerprint::NONE, transient, |_| async {
                unreachable!("replayed, not run")
            })
            .await?;
        assert!(matches!(again, Run::Replayed(ref o) if o == b"done by 2"));
        Ok(())
    })
}

#[test]
fn a_run_dropped_inside_its_work_leaves_an_interrupted_attempt() -> Result<()> {
    let dir = tempdir();
    let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    let policy = RetryPolicy::new();
    let key = Key::new("t", "op");
    let transient = |_: &String| ErrorClass::Retryable;
    runtime().block_on(async {
        // The work starts and never finishes; the run is dropped inside it.
        let (started, in_work) = tokio::sync::oneshot::channel::<()>();
        let run = policy.run_async(&store, &key, Fingerprint::NONE, transient, |_| {
            let _ = started.send(());
            std::future::pending::<std::result::Result<Vec<u8>, String>>()
        });
        tokio::select! {
            _ = run => panic!("the work never ends"),
            _ = in_work => {}
        }
        let next = policy
            .run_async(&store, &key, Fingerprint::NONE, transient, |claim| {
                let interrupted = claim.interrupted();
                async move { Ok(vec![u8::from(interrupted)]) }
            })
            .await?;
        assert!(matches!(next, Run::Done(ref o) if o == &[1]), "{next:?}");
        Ok(())
    })
}

#[test]
fn call_async_asks_the_provider_after_an_interrupted_call() -> Result<()> {
    let dir = tempdir();
    let store = AsyncStore::new(Store::open(dir.path().join("s.redb"))?);
    let policy = RetryPolicy::new();
    let key = Key::new("t", "ship-7");
    let request = b"order 7";
    let calls = Arc::new(AtomicUsize::new(0));
    let (reached, at_carrier) = tokio::sync::oneshot::channel::<()>();
    let mut reached = Some(reached);
    let mut effect = |hang: bool| {
        let calls = Arc::clone(&calls);
        let reached = if hang { reached.take() } else { None };
        Effect::new_async(
            Intent {
                target: "carrier",
                request,
            },
            |claim| {
                // The carrier has the first attempt's call.
                let found = (claim.attempt() > 1).then(|| b"1Z001".to_vec());
                async move { Ok::<_, String>(found) }
            },
            move |_claim| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                if let Some(reached) = reached {
                    // The carrier has the call; its answer never comes back.
                    let _ = reached.send(());
                    std::future::pending::<()>().await;
                }
                Ok(b"1Z001".to_vec())
            },
            |_: &String| ErrorClass::Unanswered,
        )
    };
    runtime().block_on(async {
        let fp = Fingerprint::of(&request[..]);
        // The first call reaches the carrier, then its task is dropped.
        tokio::select! {
            _ = policy.call_async(&store, &key, fp, effect(true)) => panic!("never answered"),
            _ = at_carrier => {}
        }
        let run = policy.call_async(&store, &key, fp, effect(false)).await?;
        assert!(
            matches!(run, Run::Reconciled(ref r) if r == b"1Z001"),
            "{run:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "not called twice");
        Ok(())
    })
}
