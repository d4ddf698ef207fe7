//! `dedupkv`: the command-line tool for a dedupkv store (docs/cli.md).
//!
//! Reads go through the read-only open: they never write a byte to the
//! file and never take a lock that blocks a live writer. Writes need
//! `--write`, which opens the store writable (refused while another
//! process holds it). `filter` dedups JSON lines in a shell pipeline.

mod filter;
mod open;
mod records;
mod replica;
mod show;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};
use dedupkv::{Error, Key, Listing, Page, Resolution, Store};
use serde_json::{Value, json};

/// Exit codes, also in `--help` and docs/cli.md.
pub mod exit {
    /// Done.
    pub const OK: u8 = 0;
    /// An error: the message on stderr names the path, the key or the line.
    pub const ERROR: u8 = 1;
    /// Bad usage (clap's own code for it).
    pub const USAGE: u8 = 2;
    /// `verify` found damage.
    pub const DAMAGED: u8 = 3;
    /// `get` found no record of the key.
    pub const NOT_FOUND: u8 = 4;
}

const EXIT_CODES: &str =
    "Exit codes: 0 ok, 1 error, 2 usage, 3 damaged (verify), 4 not found (get).";

/// Works a dedupkv store from a terminal: reads offline through the
/// read-only open (also beside a running writer, never writing to the
/// file), writes only with `--write`, and dedups JSON lines (`filter`).
#[derive(Parser)]
#[command(name = "dedupkv", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What every command that reads a store takes.
#[derive(Args)]
struct Common {
    /// The store file.
    #[arg(long, short = 's', env = "DEDUPKV_STORE")]
    store: PathBuf,
    /// One JSON value on stdout instead of text.
    #[arg(long)]
    json: bool,
}

/// Which entries a listing shows.
#[derive(Args)]
struct Filter {
    /// Only this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Only entries at least this old (`90s`, `36h`, `7d`).
    #[arg(long, value_parser = duration)]
    older_than: Option<Duration>,
    /// At most this many entries.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

impl Filter {
    /// The listing of these filters (the library's default page size).
    fn listing(&self) -> Listing {
        let mut listing = Listing::new();
        if let Some(s) = &self.scope {
            listing = listing.scope(s);
        }
        if let Some(age) = self.older_than {
            listing = listing.older_than(age);
        }
        listing
    }
}

/// A key.
#[derive(Args)]
struct KeyArg {
    /// The key's scope (keys always have one).
    #[arg(long)]
    scope: String,
    /// The key's id.
    id: String,
}

/// A write's opt-in.
#[derive(Args)]
struct Write {
    /// Open the store writable for this write (refused while another
    /// process holds it). Without it, nothing is written.
    #[arg(long)]
    write: bool,
}

/// A listing's arguments.
#[derive(Args)]
struct ListArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    filter: Filter,
}

/// A write to the whole store.
#[derive(Args)]
struct StoreWrite {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    write: Write,
}

/// A write to one key.
#[derive(Args)]
struct KeyWrite {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    key: KeyArg,
    #[command(flatten)]
    write: Write,
}

#[derive(Subcommand)]
enum Command {
    /// One key's record: state, attempts, times, lease and holder token,
    /// fingerprint, outcome, provider key, intent, dead-letter reason.
    #[command(after_help = EXIT_CODES)]
    Get {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        key: KeyArg,
    },
    /// Keys, states, dead letters, stranded claims, pending intents,
    /// retention window and file size.
    Stats {
        #[command(flatten)]
        common: Common,
    },
    /// Reads every record and checks it; changes nothing. Exit 3 if damaged.
    #[command(after_help = EXIT_CODES)]
    Verify {
        #[command(flatten)]
        common: Common,
    },
    /// The dead-letter area.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
    /// The sequencer's holding area.
    #[command(subcommand)]
    Held(HeldCmd),
    /// Intents.
    #[command(subcommand)]
    Intents(Intents),
    /// Claims nobody came back for (lease lapsed or process gone).
    Stranded(ListArgs),
    /// Live records, by scope, state and age (each as `get` shows it).
    Keys {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        filter: Filter,
        /// Only this state: `Inserted`, `InProgress`, `Retryable`, `Completed`,
        /// `Failed`, `DeadLettered`.
        #[arg(long)]
        state: Option<String>,
    },
    /// Every live record as one JSON line (the `get --json` form) on
    /// stdout, for audits and backups.
    Export {
        /// The store file.
        #[arg(long, short = 's', env = "DEDUPKV_STORE")]
        store: PathBuf,
        /// JSON lines (the one format; required so a later format can be
        /// added).
        #[arg(long, required = true)]
        jsonl: bool,
        /// Only this scope.
        #[arg(long)]
        scope: Option<String>,
    },
    /// Reads `export --jsonl` lines (stdin or FILE) into a fresh store.
    Import {
        /// The new store file (refused if it exists).
        #[arg(long, short = 's')]
        store: PathBuf,
        /// The export (default: stdin).
        file: Option<PathBuf>,
    },
    /// Evicts keys past retention (needs --write).
    Evict(StoreWrite),
    /// Compacts the file (needs --write).
    Compact(StoreWrite),
    /// Upgrades the file to this build's format (needs --write).
    Upgrade(StoreWrite),
    /// A store's replica in a bucket, read without taking it over.
    #[command(subcommand)]
    Replica(ReplicaCmd),
    /// Dedups JSON lines: each line whose key is new goes to stdout, in
    /// input order.
    #[command(after_help = filter::GUARANTEE)]
    Filter(filter::FilterArgs),
}

#[derive(Subcommand)]
enum DeadLetters {
    /// Dead letters, oldest first.
    List(ListArgs),
    /// Gives a dead-lettered key its attempts back (needs --write).
    Requeue(KeyWrite),
    /// Settles a dead-lettered key by hand (needs --write).
    Resolve {
        #[command(flatten)]
        target: KeyWrite,
        /// It was done after all: store this outcome.
        #[arg(long, conflicts_with = "abandon", required_unless_present = "abandon")]
        completed: Option<String>,
        /// It will not be done: store a final failure with this note.
        #[arg(long)]
        abandon: Option<String>,
    },
}

#[derive(Subcommand)]
enum HeldCmd {
    /// Held events, oldest first.
    List(ListArgs),
    /// Delivers an entity's held events in order (needs --write).
    Release(KeyWrite),
}

#[derive(Subcommand)]
enum ReplicaCmd {
    /// Its owner, epoch, newest segment and its age (the lag), newest
    /// snapshot; with `--scope S ID` a key's record from a scratch copy.
    /// Never writes to the bucket, never fences the owner.
    Inspect(replica::InspectArgs),
}

#[derive(Subcommand)]
enum Intents {
    /// Intents recorded and not answered, oldest first.
    Pending(ListArgs),
}

/// A failed command: its exit code and message.
struct Fail(u8, String);

impl From<String> for Fail {
    fn from(msg: String) -> Fail {
        Fail(exit::ERROR, msg)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::from(exit::OK),
        Err(Fail(code, msg)) => {
            eprintln!("dedupkv: {msg}");
            ExitCode::from(code)
        }
    }
}

fn run(command: Command) -> Result<(), Fail> {
    let now = SystemTime::now();
    match command {
        Command::Get { common, key } => get(&common, &key, now),
        Command::Stats { common } => {
            let store = open::read_only(&common.store)?;
            show::print(&stats(&store, &common.store)?, common.json);
            Ok(())
        }
        Command::Verify { common } => verify(&common),
        Command::DeadLetters(DeadLetters::List(a)) => {
            list(&a, Store::dead_letters, |d| show::dead_letter(d, now))
        }
        Command::Held(HeldCmd::List(a)) => list(&a, Store::holding_area, |h| show::held(h, now)),
        Command::Intents(Intents::Pending(a)) => {
            list(&a, Store::pending_intents, |i| show::intent(i, now))
        }
        Command::Stranded(a) => list(&a, Store::stranded_claims, |r| show::record(r, now)),
        Command::DeadLetters(DeadLetters::Requeue(w)) => write_key(&w, "requeued", Store::requeue),
        Command::DeadLetters(DeadLetters::Resolve {
            target,
            completed,
            abandon,
        }) => write_key(&target, "resolved", |s, k| match &completed {
            Some(outcome) => s.resolve(k, Resolution::Completed(outcome.as_bytes())),
            None => s.resolve(k, Resolution::Abandoned(abandon.as_deref().unwrap_or(""))),
        }),
        Command::Held(HeldCmd::Release(w)) => write_key(&w, "released", |s, k| {
            s.release_held(k).map(|d| !d.is_empty())
        }),
        Command::Keys {
            common,
            filter,
            state,
        } => keys(&common, &filter, state.as_deref(), now),
        Command::Export {
            store,
            jsonl: _,
            scope,
        } => {
            let s = open::read_only(&store)?;
            let listing = scope.map_or_else(Listing::new, |sc| Listing::new().scope(sc));
            let n = records::export(&s, listing)?;
            eprintln!("dedupkv export: {n} records");
            Ok(())
        }
        Command::Import { store, file } => {
            let done = match &file {
                Some(f) => {
                    let input =
                        std::fs::File::open(f).map_err(|e| format!("{}: {e}", f.display()))?;
                    records::import(&store, std::io::BufReader::new(input))
                }
                None => records::import(&store, std::io::stdin().lock()),
            }?;
            eprintln!(
                "dedupkv import: {} records, {} skipped",
                done.records, done.skipped
            );
            Ok(())
        }
        Command::Evict(w) => write_store(&w.common, &w.write, |s| {
            let e = s.evict_expired()?;
            Ok(json!({ "buckets": e.buckets, "keys": e.keys }))
        }),
        Command::Compact(w) => write_store(&w.common, &w.write, |s| {
            Ok(json!({ "compacted": s.compact()? }))
        }),
        Command::Upgrade(w) => write_store(&w.common, &w.write, |s| {
            Ok(json!({ "upgraded": s.upgrade()? }))
        }),
        Command::Replica(ReplicaCmd::Inspect(args)) => {
            show::print(&replica::inspect(&args)?, args.json);
            Ok(())
        }
        Command::Filter(args) => filter::run(&args).map_err(Fail::from),
    }
}

fn get(common: &Common, key: &KeyArg, now: SystemTime) -> Result<(), Fail> {
    let store = open::read_only(&common.store)?;
    let k = Key::new(&key.scope, &key.id);
    let named = |e: Error| open::named(&common.store, &e);
    let Some(record) = store.get(&k).map_err(named)? else {
        return Err(Fail(
            exit::NOT_FOUND,
            format!("{}: no record of {k}", common.store.display()),
        ));
    };
    let mut v = show::record(&record, now);
    let intent = store.intent(&k).map_err(named)?;
    v["intent"] = intent.map_or(Value::Null, |i| show::intent(&i, now));
    let mut dead = Value::Null;
    if record.state() == dedupkv::State::DeadLettered {
        let all = pages(
            &store,
            Listing::new().scope(k.scope()),
            usize::MAX,
            Store::dead_letters,
        )
        .map_err(named)?;
        if let Some(d) = all.iter().find(|d| d.key() == &k) {
            dead = json!({ "reason": d.reason(), "failed": show::time(d.failed_at(), now) });
        }
    }
    v["dead_letter"] = dead;
    show::print(&v, common.json);
    Ok(())
}

fn stats(store: &Store, path: &Path) -> Result<Value, String> {
    let s = store.stats();
    let size = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(json!({
        "file": path.display().to_string(),
        "file_bytes": size.len(),
        "format": s.format,
        "keys": s.keys,
        "in_progress": s.in_progress,
        "dead_letters": s.dead_letters_now,
        "oldest_dead_letter": s.oldest_dead_letter.map(show::human),
        "stranded_claims": s.stranded_claims,
        "intents_pending": s.intents_pending,
        "parked_events": s.parked_now,
        "held_events": s.held_now,
        "unacked_events": s.unacked_now,
        "entities": s.entities,
        "retention": show::human(s.retention),
        "effective_window": show::human(s.effective_window),
        "index_bytes": s.index_bytes,
    }))
}

fn verify(common: &Common) -> Result<(), Fail> {
    let store = open::read_only(&common.store).map_err(|msg| {
        if msg.contains("corrupt") {
            Fail(exit::DAMAGED, msg)
        } else {
            Fail(exit::ERROR, msg)
        }
    })?;
    match store.verify() {
        Ok(rows) => {
            show::print(&json!({ "clean": true, "rows": rows }), common.json);
            Ok(())
        }
        Err(e @ Error::Corrupt(_)) => {
            let damage = open::named(&common.store, &e);
            show::print(&json!({ "clean": false, "damage": damage }), common.json);
            Err(Fail(exit::DAMAGED, damage))
        }
        Err(e) => Err(open::named(&common.store, &e).into()),
    }
}

/// Up to `limit` items of a listing, page after page.
fn pages<T>(
    store: &Store,
    listing: Listing,
    limit: usize,
    next: impl Fn(&Store, &Listing) -> dedupkv::Result<Page<T>>,
) -> dedupkv::Result<Vec<T>> {
    let mut all = Vec::new();
    let mut listing = listing.limit(limit.min(1000));
    loop {
        let page = next(store, &listing)?;
        all.extend(page.items);
        match page.next {
            Some(c) if all.len() < limit => listing = listing.after(c),
            _ => break,
        }
    }
    all.truncate(limit);
    Ok(all)
}

fn list<T>(
    ListArgs { common, filter }: &ListArgs,
    next: impl Fn(&Store, &Listing) -> dedupkv::Result<Page<T>>,
    render: impl Fn(&T) -> Value,
) -> Result<(), Fail> {
    let store = open::read_only(&common.store)?;
    let listing = filter.listing();
    let items =
        pages(&store, listing, filter.limit, next).map_err(|e| open::named(&common.store, &e))?;
    show::print(
        &Value::Array(items.iter().map(render).collect()),
        common.json,
    );
    Ok(())
}

fn keys(
    common: &Common,
    filter: &Filter,
    state: Option<&str>,
    now: SystemTime,
) -> Result<(), Fail> {
    let store = open::read_only(&common.store)?;
    let listing = filter.listing().limit(filter.limit.clamp(1, 1000));
    let mut items = Vec::new();
    records::each_record(&store, listing, |r| {
        if state.is_none_or(|s| records::state_name(r.state()).eq_ignore_ascii_case(s)) {
            items.push(show::record(r, now));
        }
        Ok(items.len() < filter.limit)
    })
    .map_err(|e| open::named(&common.store, &e))??;
    show::print(&Value::Array(items), common.json);
    Ok(())
}

fn check_write(write: &Write) -> Result<(), Fail> {
    if write.write {
        Ok(())
    } else {
        Err(Fail(
            exit::USAGE,
            "this command writes: add --write to open the store writable (refused while \
             another process holds it)"
                .into(),
        ))
    }
}

fn write_store(
    common: &Common,
    write: &Write,
    act: impl FnOnce(&Store) -> dedupkv::Result<Value>,
) -> Result<(), Fail> {
    check_write(write)?;
    let store = open::writable(&common.store)?;
    let v = act(&store).map_err(|e| open::named(&common.store, &e))?;
    show::print(&v, common.json);
    Ok(())
}

fn write_key(
    KeyWrite { common, key, write }: &KeyWrite,
    what: &str,
    act: impl FnOnce(&Store, &Key<'_>) -> dedupkv::Result<bool>,
) -> Result<(), Fail> {
    let k = Key::new(&key.scope, &key.id);
    write_store(common, write, |s| Ok(json!({ what: act(s, &k)? })))
}

/// A human duration: `90s`, `36h`, `7d`, `1h 30m`.
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration like 90s, 36h or 7d: {e}"))
}
