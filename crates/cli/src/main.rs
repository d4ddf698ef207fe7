//! `dedupkv`: the command-line tool for a dedupkv store (docs/cli.md).
//!
//! Reads go to the live admin endpoint of the process that holds the
//! store when one answers beside it, else through the read-only open:
//! they never write a byte to the file and never take a lock that blocks
//! a live writer. Writes need `--write`, and go to the live endpoint
//! (when it allows them) or open the store writable. `filter` dedups
//! JSON lines in a shell pipeline.

mod filter;
mod help;
mod live;
mod open;
mod progress;
mod records;
mod replica;
mod show;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use dedupkv::{Error, Listing};
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

/// Works a dedupkv store from a terminal: reads through the live admin
/// endpoint of the process that holds the store when one answers beside
/// it (`STORE.admin.sock`), else offline through the read-only open (never
/// writing to the file); writes only with `--write`; dedups JSON lines
/// (`filter`).
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
    /// The request of `op` with these filters.
    fn request(&self, op: &str) -> Value {
        json!({
            "op": op,
            "scope": self.scope,
            "older_than": self.older_than.map(|d| humantime::format_duration(d).to_string()),
            "limit": self.limit,
        })
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
    /// Write: through the live endpoint of the process that holds the
    /// store (when it allows writes), else by opening the store writable
    /// (refused while another process holds it). Without it, nothing is
    /// written.
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
    /// fingerprint, outcome, provider key, intent, dead-letter reason;
    /// with --history every record of the key still in the store.
    #[command(after_help = EXIT_CODES)]
    Get {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        key: KeyArg,
        /// A partition set (`--store BASE` or a partition's file): find the
        /// key in whichever assigned partition holds it (live endpoint).
        #[arg(long, conflicts_with = "partition")]
        all: bool,
        /// A partition set: this partition's store (live endpoint).
        #[arg(long)]
        partition: Option<i32>,
        /// Also every record of the key still in the store, oldest first
        /// (each: kind, when, attempt, fencing token, owner epoch, outcome
        /// or failure). Scans the key's buckets: slower than a plain get.
        #[arg(long)]
        history: bool,
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
    /// Prints a shell completion script on stdout (`dedupkv completions
    /// bash > /etc/bash_completion.d/dedupkv`).
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Prints the man page (roff) on stdout (`dedupkv man > dedupkv.1`);
    /// with --dir, writes one page per command and subcommand there.
    Man {
        /// Write `dedupkv.1` and a page per subcommand (`dedupkv-get.1`,
        /// `dedupkv-dead-letters-list.1`, ...) into this existing
        /// directory, replacing pages of the same names.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
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
    /// snapshot, read from the bucket. Never writes to the bucket, never
    /// fences the owner. (The owner's own view, upload failures and
    /// fencing included, is in `dedupkv stats` through its live endpoint.)
    Status(replica::StatusArgs),
    /// Makes a store file from the replica and takes ownership of it:
    /// only with --take-ownership, since its owner now is fenced.
    Restore(replica::RestoreArgs),
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
    match command {
        Command::Get {
            common,
            key,
            all,
            partition,
            history,
        } => {
            let mut request = json!({ "op": "get", "scope": key.scope, "id": key.id });
            if history {
                request["history"] = json!(true);
            }
            if all {
                request["all"] = json!(true);
            }
            if let Some(p) = partition {
                request["partition"] = json!(p);
            }
            read(&common, request)
        }
        Command::Stats { common } => read(&common, json!({ "op": "stats" })),
        Command::Verify { common } => verify(&common),
        Command::DeadLetters(DeadLetters::List(a)) => list(&a, "dead_letters"),
        Command::Held(HeldCmd::List(a)) => list(&a, "held"),
        Command::Intents(Intents::Pending(a)) => list(&a, "intents_pending"),
        Command::Stranded(a) => list(&a, "stranded"),
        Command::DeadLetters(DeadLetters::Requeue(w)) => write_key(&w, json!({ "op": "requeue" })),
        Command::DeadLetters(DeadLetters::Resolve {
            target,
            completed,
            abandon,
        }) => write_key(
            &target,
            json!({ "op": "resolve", "completed": completed, "abandon": abandon }),
        ),
        Command::Held(HeldCmd::Release(w)) => write_key(&w, json!({ "op": "release" })),
        Command::Keys {
            common,
            filter,
            state,
        } => {
            let mut request = filter.request("keys");
            request["state"] = json!(state);
            read(&common, request)
        }
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
        Command::Evict(w) => write_store(&w, "evict"),
        Command::Compact(w) => {
            let _progress = progress::Progress::spinner("compact");
            write_store(&w, "compact")
        }
        Command::Upgrade(w) => write_store(&w, "upgrade"),
        Command::Replica(ReplicaCmd::Status(args)) => {
            show::print(&replica::status(&args)?, args.json);
            Ok(())
        }
        Command::Replica(ReplicaCmd::Restore(args)) => {
            let restored = {
                let _progress = progress::Progress::spinner("restore");
                replica::restore(&args)?
            };
            show::print(&restored, args.json);
            Ok(())
        }
        Command::Replica(ReplicaCmd::Inspect(args)) => {
            show::print(&replica::inspect(&args)?, args.json);
            Ok(())
        }
        Command::Filter(args) => filter::run(&args).map_err(Fail::from),
        Command::Completions { shell } => help::completions(shell).map_err(Fail::from),
        Command::Man { dir: None } => help::man().map_err(Fail::from),
        Command::Man { dir: Some(dir) } => help::man_pages(&dir).map_err(Fail::from),
    }
}

/// A read: through the live endpoint when one answers, else offline.
fn read(common: &Common, request: Value) -> Result<(), Fail> {
    let v = live::ask(&common.store, request, false)?;
    show::print(&v, common.json);
    Ok(())
}

fn list(ListArgs { common, filter }: &ListArgs, op: &str) -> Result<(), Fail> {
    read(common, filter.request(op))
}

fn verify(common: &Common) -> Result<(), Fail> {
    let progress = progress::Progress::spinner("verify: reading every record");
    let store = open::read_only(&common.store).map_err(|msg| {
        if msg.contains("corrupt") {
            Fail(exit::DAMAGED, msg)
        } else {
            Fail(exit::ERROR, msg)
        }
    })?;
    let verified = store.verify();
    drop(progress);
    match verified {
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

fn check_write(write: &Write) -> Result<(), Fail> {
    if write.write {
        Ok(())
    } else {
        Err(Fail(
            exit::USAGE,
            "this command writes: add --write (it goes to the live admin endpoint of the \
             process that holds the store when that allows writes, else opens the store \
             writable)"
                .into(),
        ))
    }
}

/// A write to the whole store (`evict`, `compact`, `upgrade`), live or
/// offline.
fn write_store(StoreWrite { common, write }: &StoreWrite, op: &str) -> Result<(), Fail> {
    check_write(write)?;
    let v = live::ask(&common.store, json!({ "op": op }), true)?;
    show::print(&v, common.json);
    Ok(())
}

/// A write to one key, live or offline.
fn write_key(KeyWrite { common, key, write }: &KeyWrite, mut request: Value) -> Result<(), Fail> {
    check_write(write)?;
    request["scope"] = json!(key.scope);
    request["id"] = json!(key.id);
    let v = live::ask(&common.store, request, true)?;
    show::print(&v, common.json);
    Ok(())
}

/// A human duration: `90s`, `36h`, `7d`, `1h 30m`.
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration like 90s, 36h or 7d: {e}"))
}
