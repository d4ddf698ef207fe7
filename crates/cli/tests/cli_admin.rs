//! The live admin endpoint, with the built `dedupkv` binary as the second
//! process: this test process holds the store (or a partition set) open
//! and serves it, so an offline open would be refused, and the CLI reads
//! and works it through the endpoint. Also: the socket's permissions and
//! the refusal of an unsafe directory, a stale socket replaced and a live
//! one refused, bad requests answered while the server goes on, and no
//! write for a read.

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dedupkv::admin::{AdminOptions, AdminServer, socket_path};
use dedupkv::partitions::PartitionSet;
use dedupkv::replica::Replica;
use dedupkv::replica::object_store::local::LocalFileSystem;
use dedupkv::{Begin, Error, Failure, Fingerprint, Key, Store};
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

mod common;
use common::{dedupkv, json};

/// An owner-only directory for the store and its socket.
fn private_dir() -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// A store at `dir/s.redb` serving its endpoint with `opts`: an inserted
/// key and a dead letter.
fn serving(dir: &Path, opts: AdminOptions) -> Result<(Store, PathBuf), Error> {
    let path = dir.join("s.redb");
    let store = Store::builder()
        .background_eviction(false)
        .admin_socket(opts)
        .open(&path)?;
    store.insert_if_absent(&Key::new("orders", "4711"))?;
    if let Begin::Started(c) = store.begin(&Key::new("pay", "p-9"), Fingerprint::of("x"))? {
        let reason = "card declined 3 times";
        store.fail(
            &c,
            Failure::Exhausted {
                reason,
                payload: None,
            },
        )?;
    }
    Ok((store, path))
}

/// One raw request line to `socket`, and the answer line.
fn raw(socket: &Path, line: &[u8]) -> Result<Value, Box<dyn std::error::Error>> {
    let mut conn = UnixStream::connect(socket)?;
    // The server may answer an oversized request and close before all of
    // it is sent: the write can fail, the answer is there to read.
    let _ = conn.write_all(line);
    let mut answer = String::new();
    BufReader::new(conn).read_line(&mut answer)?;
    Ok(serde_json::from_str(&answer)?)
}

/// A value with the ages (which move with the clock) taken out.
fn without_ages(mut v: Value) -> Value {
    match &mut v {
        Value::Object(m) => {
            m.remove("age");
            for x in m.values_mut() {
                *x = without_ages(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = without_ages(x.take());
            }
        }
        _ => {}
    }
    v
}

#[test]
fn the_cli_reads_through_the_endpoint_of_the_process_that_holds_the_store() -> TestResult {
    let dir = private_dir()?;
    let (store, path) = serving(dir.path(), AdminOptions::new())?;
    let p = path.to_str().ok_or("path")?;
    // The store is held here: an offline open would be refused.
    assert!(matches!(
        Store::open_existing(&path),
        Err(Error::AlreadyOpen)
    ));

    let live = json(&dedupkv(&[
        "get", "-s", p, "--scope", "orders", "4711", "--json",
    ])?)?;
    assert_eq!(live["state"], "Inserted");
    assert_eq!(live["id"], "4711");
    let dead = json(&dedupkv(&[
        "get", "-s", p, "--scope", "pay", "p-9", "--json",
    ])?)?;
    assert_eq!(dead["dead_letter"]["reason"], "card declined 3 times");
    let history_args = [
        "get",
        "-s",
        p,
        "--scope",
        "pay",
        "p-9",
        "--history",
        "--json",
    ];
    let history = json(&dedupkv(&history_args)?)?;
    let kinds: Vec<_> = history["history"]
        .as_array()
        .ok_or("no history")?
        .iter()
        .map(|a| a["kind"].as_str())
        .collect();
    assert_eq!(kinds, [Some("InProgress"), Some("DeadLettered")]);
    assert_eq!(history["history"][1]["failure"], "card declined 3 times");
    let stats = json(&dedupkv(&["stats", "-s", p, "--json"])?)?;
    assert_eq!(stats["keys"], 2);
    assert_eq!(stats["dead_letters"], 1);
    let listed = json(&dedupkv(&["dead-letters", "list", "-s", p, "--json"])?)?;
    assert_eq!(listed[0]["reason"], "card declined 3 times");
    let keys = json(&dedupkv(&[
        "keys", "-s", p, "--state", "inserted", "--json",
    ])?)?;
    assert_eq!(keys.as_array().map(Vec::len), Some(1));
    let text = dedupkv(&["get", "-s", p, "--scope", "orders", "4711"])?;
    assert!(String::from_utf8_lossy(&text.stdout).contains("state: Inserted"));
    let missing = dedupkv(&["get", "-s", p, "--scope", "orders", "0000"])?;
    assert_eq!(missing.status.code(), Some(4));

    // The same answers offline, once the holder is gone (ages aside).
    let held_stats = without_ages(stats);
    drop(store);
    assert!(
        !socket_path(&path).exists(),
        "the socket goes with the store"
    );
    let offline = json(&dedupkv(&[
        "get", "-s", p, "--scope", "orders", "4711", "--json",
    ])?)?;
    assert_eq!(without_ages(offline), without_ages(live));
    let offline = json(&dedupkv(&history_args)?)?;
    assert_eq!(without_ages(offline), without_ages(history));
    let offline_stats = json(&dedupkv(&["stats", "-s", p, "--json"])?)?;
    let mut a = without_ages(offline_stats);
    let mut b = held_stats;
    // The file grows when the store closes, and the effective window and
    // the oldest dead letter's age move with the clock: not the point.
    for moving in ["file_bytes", "effective_window", "oldest_dead_letter"] {
        a[moving] = Value::Null;
        b[moving] = Value::Null;
    }
    assert_eq!(a, b);
    Ok(())
}

#[test]
fn operator_writes_go_through_only_when_the_endpoint_allows_them() -> TestResult {
    let dir = private_dir()?;
    let (store, path) = serving(dir.path(), AdminOptions::new())?;
    let p = path.to_str().ok_or("path")?;
    let requeue = [
        "dead-letters",
        "requeue",
        "-s",
        p,
        "--scope",
        "pay",
        "p-9",
        "--write",
        "--json",
    ];
    let refused = dedupkv(&requeue)?;
    assert_eq!(refused.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&refused.stderr);
    assert!(msg.contains("allow_writes(true)"), "{msg}");
    assert!(
        store
            .get(&Key::new("pay", "p-9"))?
            .is_some_and(|r| r.state() == dedupkv::State::DeadLettered)
    );
    let compact = dedupkv(&["compact", "-s", p, "--write"])?;
    assert_eq!(compact.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&compact.stderr).contains("allow_writes(true)"));
    drop(store);

    // The same store, served by a process that allows writes.
    let (store, _) = serving(dir.path(), AdminOptions::new().allow_writes(true))?;
    let done = json(&dedupkv(&requeue)?)?;
    assert_eq!(done["requeued"], true);
    let state = store.get(&Key::new("pay", "p-9"))?.map(|r| r.state());
    assert!(
        state.is_some_and(|s| s != dedupkv::State::DeadLettered),
        "{state:?}"
    );
    // Without --write nothing is sent.
    let usage = dedupkv(&["evict", "-s", p])?;
    assert_eq!(usage.status.code(), Some(2));
    let evicted = json(&dedupkv(&["evict", "-s", p, "--write", "--json"])?)?;
    assert!(evicted["keys"].is_number());
    // `compact` and `upgrade` too, while this process holds the store.
    let compacted = json(&dedupkv(&["compact", "-s", p, "--write", "--json"])?)?;
    assert!(compacted["compacted"].is_boolean(), "{compacted}");
    let upgraded = json(&dedupkv(&["upgrade", "-s", p, "--write", "--json"])?)?;
    assert_eq!(
        upgraded["upgraded"], false,
        "a new file is the newest format"
    );
    assert!(store.get(&Key::new("orders", "4711"))?.is_some());
    Ok(())
}

#[test]
fn the_socket_is_owner_only_and_an_open_directory_is_refused() -> TestResult {
    let dir = private_dir()?;
    let (store, path) = serving(dir.path(), AdminOptions::new())?;
    let mode = std::fs::metadata(socket_path(&path))?.permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(store);

    let open = dir.path().join("open");
    std::fs::create_dir(&open)?;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777))?;
    let err = serving(&open, AdminOptions::new()).expect_err("refused");
    let msg = err.to_string();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(msg.contains(&open.display().to_string()), "{msg}");
    assert!(msg.contains("writable by group or others"), "{msg}");
    // The store was closed again: it opens.
    drop(Store::open_existing(open.join("s.redb"))?);
    assert!(!socket_path(open.join("s.redb")).exists());
    Ok(())
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_refused() -> TestResult {
    let dir = private_dir()?;
    let path = dir.path().join("s.redb");
    // A socket file nothing listens on: its process is gone.
    drop(UnixListener::bind(socket_path(&path))?);
    assert!(socket_path(&path).exists());
    let (store, _) = serving(dir.path(), AdminOptions::new())?;
    let answer = raw(&socket_path(&path), b"{\"op\":\"stats\"}\n")?;
    assert_eq!(answer["ok"]["keys"], 2);
    drop(store);

    // A live socket (another process serves there) is left alone.
    let live = UnixListener::bind(socket_path(&path))?;
    let err = serving(dir.path(), AdminOptions::new()).expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains("a live admin endpoint answers there"), "{msg}");
    assert!(
        msg.contains(&socket_path(&path).display().to_string()),
        "{msg}"
    );
    assert!(socket_path(&path).exists());
    drop(live);
    // Not a socket: never removed.
    std::fs::remove_file(socket_path(&path))?;
    std::fs::write(socket_path(&path), b"notes")?;
    let err = serving(dir.path(), AdminOptions::new()).expect_err("refused");
    assert!(err.to_string().contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(socket_path(&path))?, b"notes");
    Ok(())
}

#[test]
fn bad_requests_get_an_error_answer_and_the_server_goes_on() -> TestResult {
    let dir = private_dir()?;
    let opts = AdminOptions::new().max_request_bytes(1024);
    let (store, path) = serving(dir.path(), opts)?;
    let socket = socket_path(&path);
    let garbage = raw(&socket, b"garbage\n")?;
    assert_eq!(garbage["kind"], "bad_request");
    assert!(
        garbage["error"]
            .as_str()
            .is_some_and(|e| e.contains("not JSON"))
    );
    let mut big = vec![b'x'; 100_000];
    big.push(b'\n');
    let oversized = raw(&socket, &big)?;
    assert!(
        oversized["error"]
            .as_str()
            .is_some_and(|e| e.contains("longer than 1024"))
    );
    let unknown = raw(&socket, b"{\"op\":\"drop_table\"}\n")?;
    assert!(
        unknown["error"]
            .as_str()
            .is_some_and(|e| e.contains("unknown op"))
    );
    let no_key = raw(&socket, b"{\"op\":\"get\",\"scope\":7}\n")?;
    assert_eq!(no_key["kind"], "bad_request");
    // A client that connects and says nothing, then goes.
    drop(UnixStream::connect(&socket)?);
    // Still served, and the store still works.
    let next = raw(
        &socket,
        b"{\"op\":\"get\",\"scope\":\"orders\",\"id\":\"4711\"}\n",
    )?;
    assert_eq!(next["ok"]["state"], "Inserted");
    assert!(store.insert_if_absent(&Key::new("orders", "4712"))?);
    Ok(())
}

#[test]
fn reads_through_the_endpoint_never_write() -> TestResult {
    let dir = private_dir()?;
    let (store, path) = serving(dir.path(), AdminOptions::new().allow_writes(true))?;
    store.flush()?;
    let before = (std::fs::read(&path)?, std::fs::metadata(&path)?.modified()?);
    let p = path.to_str().ok_or("path")?;
    for args in [
        &["get", "-s", p, "--scope", "orders", "4711", "--json"][..],
        &["stats", "-s", p, "--json"],
        &["keys", "-s", p, "--json"],
        &["dead-letters", "list", "-s", p, "--json"],
        &["held", "list", "-s", p, "--json"],
        &["intents", "pending", "-s", p, "--json"],
        &["stranded", "-s", p, "--json"],
    ] {
        json(&dedupkv(args)?)?;
    }
    let after = (std::fs::read(&path)?, std::fs::metadata(&path)?.modified()?);
    assert!(
        before == after,
        "a read through the endpoint changed the file"
    );
    Ok(())
}

#[test]
fn get_all_finds_the_partition_that_holds_the_key() -> TestResult {
    let dir = private_dir()?;
    let bucket = dir.path().join("bucket");
    std::fs::create_dir(&bucket)?;
    let objects = Arc::new(LocalFileSystem::new_with_prefix(&bucket)?);
    let base = dir.path().join("set");
    let set = PartitionSet::new(&base, move |p| {
        Ok(Store::builder().replica(Replica::new(objects.clone(), &format!("p/{p}"))))
    });
    for p in 0..3 {
        set.assign(p)?;
    }
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700))?;
    set.work(2)?.insert_if_absent(&Key::new("orders", "4711"))?;
    set.work(0)?.insert_if_absent(&Key::new("orders", "1"))?;
    let admin = AdminServer::partitions(&set, AdminOptions::new())?;
    let b = base.to_str().ok_or("path")?;

    let found = json(&dedupkv(&[
        "get", "-s", b, "--all", "--scope", "orders", "4711", "--json",
    ])?)?;
    assert_eq!(found["partition"], 2);
    assert_eq!(found["state"], "Inserted");
    let missing = dedupkv(&["get", "-s", b, "--all", "--scope", "orders", "none"])?;
    assert_eq!(missing.status.code(), Some(4));
    // A partition's file names its partition.
    let file = set.path_of(0);
    let f = file.to_str().ok_or("path")?;
    let one = json(&dedupkv(&[
        "get", "-s", f, "--scope", "orders", "1", "--json",
    ])?)?;
    assert_eq!(one["state"], "Inserted");
    let by_number = dedupkv(&["get", "-s", b, "--partition", "1", "--scope", "orders", "1"])?;
    assert_eq!(by_number.status.code(), Some(4));
    let stats = json(&dedupkv(&["stats", "-s", b, "--json"])?)?;
    assert_eq!(stats["assigned"], serde_json::json!([0, 1, 2]));
    drop(admin);
    assert!(!base.join("admin.sock").exists());
    Ok(())
}

#[test]
fn reads_see_the_live_store_while_its_holder_keeps_writing() -> TestResult {
    let dir = private_dir()?;
    let (store, path) = serving(dir.path(), AdminOptions::new())?;
    let p = path.to_str().ok_or("path")?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u64, Error> {
            let mut n = 0u64;
            loop {
                store.insert_if_absent(&Key::new("load", &n.to_string()))?;
                n += 1;
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
            }
            Ok(n)
        })
    };
    for round in 0..3 {
        // Written just now by the holder: the endpoint answers from the
        // live store, not a snapshot of the file.
        let id = format!("new-{round}");
        store.insert_if_absent(&Key::new("orders", &id))?;
        let v = json(&dedupkv(&[
            "get", "-s", p, "--scope", "orders", &id, "--json",
        ])?)?;
        assert_eq!(v["state"], "Inserted");
        let stats = json(&dedupkv(&["stats", "-s", p, "--json"])?)?;
        assert!(stats["keys"].as_u64().is_some_and(|k| k >= 3 + round));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().map_err(|_| "writer panicked")??;
    // The holder went on acknowledging throughout.
    assert!(
        store
            .get(&Key::new("load", &(written - 1).to_string()))?
            .is_some()
    );
    Ok(())
}

/// A client that trickles its request a byte at a time (never a newline)
/// is cut off at the request's deadline, so the one serving thread goes
/// on to the next client instead of being held for as long as it likes.
#[test]
fn a_trickling_client_is_cut_off_and_the_next_one_is_answered() -> TestResult {
    let dir = private_dir()?;
    let (_store, path) = serving(dir.path(), AdminOptions::new())?;
    let sock = socket_path(&path);
    let mut slow = UnixStream::connect(&sock)?;
    let trickler = std::thread::spawn(move || {
        // 150 bytes over 30 s if nobody cuts it off; the deadline is 2 s.
        for _ in 0..150 {
            if slow.write_all(b"{").is_err() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        false
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut next = UnixStream::connect(&sock)?;
    next.set_read_timeout(Some(std::time::Duration::from_secs(25)))?;
    next.write_all(b"{\"op\":\"stats\"}\n")?;
    let mut answer = String::new();
    BufReader::new(&next).read_line(&mut answer)?;
    let v: Value = serde_json::from_str(&answer)?;
    assert!(v["ok"]["keys"].is_u64(), "{v}");
    assert!(
        trickler.join().map_err(|_| "trickler panicked")?,
        "the trickling client was never cut off"
    );
    Ok(())
}

/// A directory that belongs to another user is refused even when only
/// its owner may write to it: that user could replace the socket. (Run
/// as root, the test gives the directory to another uid; as another user
/// it cannot, and says so.)
#[test]
fn a_directory_of_another_user_is_refused() -> TestResult {
    let dir = private_dir()?;
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs)?;
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755))?;
    if std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).is_err() {
        eprintln!("not run: giving a directory to another uid needs root");
        return Ok(());
    }
    let err = Store::builder()
        .background_eviction(false)
        .admin_socket(AdminOptions::new().path(theirs.join("ops.sock")))
        .open(dir.path().join("s.redb"))
        .map(|_| ());
    assert!(
        matches!(&err, Err(Error::Io { .. }) if format!("{err:?}").contains("another user")),
        "{err:?}"
    );
    assert!(
        !theirs.join("ops.sock").exists(),
        "the refused socket was left"
    );
    Ok(())
}
