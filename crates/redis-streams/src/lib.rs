//! A Redis Streams consumer group on dedupkv's async front, run end to end
//! with a crash (`examples/redis_streams.rs`, and `tests/redis_streams.rs`
//! runs it under `scripts/with-redis.sh`).
//!
//! - **Producer**: publishes `ORDERS` orders, about a third of them twice
//!   (a redelivering upstream), to `PARTITIONS` streams `orders:<p>`. An
//!   order goes to stream `fnv1a64(order id) % PARTITIONS`: the partition
//!   is a hash of the key, so every copy of an order lands in the same
//!   stream.
//! - **Consumers**: one process per partition at a time, all in the
//!   consumer group `payments`, each with its own store file
//!   `store-<p>.redb` (a partition's store goes with the partition). Each
//!   reads with `XREADGROUP`, runs the order's charge through
//!   [`RetryPolicy::call_async`] (claim and intent in one commit, ask the
//!   provider after an interrupted attempt, the answer recorded, then
//!   complete), and acknowledges with `XACK` only after the store's commit.
//! - **Provider**: a simulated payment provider in Redis that deduplicates
//!   by idempotency key (the claim's provider key): a repeated key returns
//!   the first charge and charges nothing. Its ledger (`ledger`, order →
//!   charge) is the system of record; `effects` counts the charges made
//!   per order.
//! - **The crash**: the consumer of partition 0 is killed (`SIGKILL`) mid-batch. Its
//!   successor (a new consumer name, same store file) takes its pending
//!   entries over with `XAUTOCLAIM`; a charge whose answer was never
//!   recorded is asked about first (`Run::Reconciled`), never sent twice.
//! - **A dropped ack**: the consumer of partition 1 skips one `XACK` on
//!   purpose; the entry stays pending, is reclaimed with `XAUTOCLAIM` once
//!   idle, redelivered, and answered from the store (`Run::Replayed`).
//!
//! At the end: ledger rows = unique orders, one charge per order (zero
//! duplicate effects, none sent twice), every entry acknowledged, the
//! duplicates the store suppressed counted, and each store's per-window
//! completion tallies reconcile with the ledger.

use std::collections::HashMap;
use std::error::Error;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dedupkv::{
    AsyncStore, Effect, ErrorClass, Fingerprint, Intent, Key, RetryPolicy, Run, Store, Tally,
};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};

/// Streams (partitions) and consumer processes.
pub const PARTITIONS: usize = 3;
/// Unique orders published.
pub const ORDERS: usize = 240;
const GROUP: &str = "payments";
/// The child's settings: `<partition>,<consumer>,<flags>`.
pub const CHILD_ENV: &str = "DEDUPKV_REDIS_CHILD";
const DIR_ENV: &str = "DEDUPKV_REDIS_STORES";
const URL_ENV: &str = "DEDUPKV_REDIS_URL";
/// A pending entry idle this long is reclaimed (a dropped ack).
const RECLAIM_IDLE_MS: u64 = 300;
/// The reconciliation window: one day, so a run never straddles two.
const WINDOW: Duration = Duration::from_secs(86_400);

/// A failure of the run, for people.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// The partition of an order: FNV-1a (64-bit) of its id, modulo
/// [`PARTITIONS`].
pub fn partition_of(order: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in order.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % PARTITIONS as u64) as usize
}

fn stream(p: usize) -> String {
    format!("orders:{p}")
}

fn amount_of(i: usize) -> i64 {
    i64::try_from(i % 50 + 1).unwrap_or(1) * 100
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn connect(url: &str) -> Result<MultiplexedConnection, BoxError> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// Publishes the orders, with duplicates; returns how many entries.
async fn produce(con: &mut MultiplexedConnection) -> Result<usize, BoxError> {
    for p in 0..PARTITIONS {
        let made: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream(p))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(con)
            .await;
        if let Err(e) = made
            && e.code() != Some("BUSYGROUP")
        {
            return Err(e.into());
        }
    }
    let mut published = 0;
    let mut add = async |i: usize| -> Result<(), BoxError> {
        let order = format!("order-{i:04}");
        let _: String = redis::cmd("XADD")
            .arg(stream(partition_of(&order)))
            .arg("*")
            .arg("order")
            .arg(&order)
            .arg("amount")
            .arg(amount_of(i))
            .query_async(con)
            .await?;
        Ok(())
    };
    for i in 0..ORDERS {
        add(i).await?;
        published += 1;
        // A redelivery soon after, for every third order.
        if i % 3 == 0 && i >= 6 {
            add(i - 6).await?;
            published += 1;
        }
    }
    Ok(published)
}

/// The provider's charge for an idempotency key: new, or the first one.
/// Atomic in Redis, so a consumer killed mid-call leaves all or nothing.
const CHARGE: &str = r"
local charge = 'ch_' .. ARGV[1]
if redis.call('HSETNX', KEYS[1], ARGV[1], charge) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
  redis.call('HSET', KEYS[3], ARGV[2], charge .. '|' .. ARGV[3] .. '|' .. ARGV[4])
else
  redis.call('INCR', KEYS[4])
end
return redis.call('HGET', KEYS[1], ARGV[1])
";

/// What one consumer process did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    /// Entries handled (read or reclaimed), redeliveries included.
    pub handled: u64,
    /// Orders charged by this process (`Run::Done`).
    pub done: u64,
    /// Orders whose charge an earlier attempt had made (`Run::Reconciled`).
    pub reconciled: u64,
    /// Duplicates the store answered from its record (`Run::Replayed`).
    pub replayed: u64,
    /// Entries taken over from another consumer with `XAUTOCLAIM`.
    pub reclaimed: u64,
    /// Entries redelivered after this process dropped their ack.
    pub redelivered: u64,
    /// The store's tallies reconciled with the ledger.
    pub clean: bool,
}

impl Summary {
    fn line(&self) -> String {
        format!(
            "summary {} {} {} {} {} {} {}",
            self.handled,
            self.done,
            self.reconciled,
            self.replayed,
            self.reclaimed,
            self.redelivered,
            u8::from(self.clean)
        )
    }

    fn parse(out: &str) -> Option<Summary> {
        let line = out.lines().find(|l| l.starts_with("summary "))?;
        let n: Vec<u64> = line
            .split(' ')
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [
            handled,
            done,
            reconciled,
            replayed,
            reclaimed,
            redelivered,
            clean,
        ] = n[..]
        else {
            return None;
        };
        Some(Summary {
            handled,
            done,
            reconciled,
            replayed,
            reclaimed,
            redelivered,
            clean: clean == 1,
        })
    }
}

/// One consumer process of partition `p`.
struct Consumer {
    p: usize,
    name: String,
    store: AsyncStore,
    policy: RetryPolicy,
    reader: MultiplexedConnection,
    ops: MultiplexedConnection,
    /// Sleep this long inside each charge, after the provider charged and
    /// before its answer is recorded (the consumer to be killed is slow,
    /// so the kill lands mid-batch, most likely inside a call).
    slow: Duration,
    /// Skip the ack of the first entry (a dropped ack).
    drop_one_ack: bool,
    dropped: Option<String>,
    summary: Summary,
}

impl Consumer {
    async fn run(mut self, reclaim_first: bool) -> Result<Summary, BoxError> {
        if reclaim_first {
            // The predecessor died: take its pending entries over.
            let reclaimed = self.autoclaim(0).await?;
            self.summary.reclaimed += reclaimed.len() as u64;
            for e in reclaimed {
                self.handle(&e).await?;
            }
        }
        loop {
            let reply: StreamReadReply = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg(&self.name)
                .arg("COUNT")
                .arg(16)
                .arg("BLOCK")
                .arg(100)
                .arg("STREAMS")
                .arg(stream(self.p))
                .arg(">")
                .query_async(&mut self.reader)
                .await?;
            let entries: Vec<StreamId> = reply.keys.into_iter().flat_map(|k| k.ids).collect();
            if !entries.is_empty() {
                for e in &entries {
                    self.handle(e).await?;
                }
                continue;
            }
            // Drained: redeliver what idles unacknowledged, then stop.
            let idle = self.autoclaim(RECLAIM_IDLE_MS).await?;
            for e in &idle {
                if self.dropped.as_deref() == Some(e.id.as_str()) {
                    self.summary.redelivered += 1;
                }
                self.handle(e).await?;
            }
            if idle.is_empty() && self.pending().await? == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.summary.clean = self.reconciles().await?;
        Ok(self.summary)
    }

    async fn autoclaim(&mut self, min_idle: u64) -> Result<Vec<StreamId>, BoxError> {
        let mut out = Vec::new();
        let mut start = "0-0".to_string();
        loop {
            let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(stream(self.p))
                .arg(GROUP)
                .arg(&self.name)
                .arg(min_idle)
                .arg(&start)
                .arg("COUNT")
                .arg(100)
                .query_async(&mut self.ops)
                .await?;
            out.extend(reply.claimed);
            if reply.next_stream_id == "0-0" {
                return Ok(out);
            }
            start = reply.next_stream_id;
        }
    }

    async fn pending(&mut self) -> Result<u64, BoxError> {
        let summary: redis::Value = redis::cmd("XPENDING")
            .arg(stream(self.p))
            .arg(GROUP)
            .query_async(&mut self.ops)
            .await?;
        let redis::Value::Array(fields) = summary else {
            return Err("XPENDING answered no array".into());
        };
        Ok(redis::from_redis_value_ref::<u64>(&fields[0])?)
    }

    async fn handle(&mut self, e: &StreamId) -> Result<(), BoxError> {
        let order: String = e.get("order").ok_or("an entry without an order")?;
        let amount: i64 = e.get("amount").ok_or("an entry without an amount")?;
        self.summary.handled += 1;
        let key = Key::new("orders", &order);
        let request = format!("charge {amount} cents for {order}");
        loop {
            let ops = self.ops.clone();
            let lookup_ops = self.ops.clone();
            let order_for_send = order.clone();
            let slow = self.slow;
            let effect = Effect::new_async(
                Intent {
                    target: "payments-provider",
                    request: request.as_bytes(),
                },
                // `call_async` took the claim's provider key (its claim
                // uploaded, with an asynchronous replica) before either
                // closure runs: `provider_key` answers at once here.
                move |claim| {
                    let (pk, mut con) = (no_key_is_io(claim.provider_key()), lookup_ops);
                    async move {
                        let pk = pk?;
                        redis::cmd("HGET")
                            .arg("charges")
                            .arg(pk)
                            .query_async::<Option<Vec<u8>>>(&mut con)
                            .await
                    }
                },
                move |claim| {
                    let (pk, mut con) = (no_key_is_io(claim.provider_key()), ops);
                    async move {
                        let pk = pk?;
                        let charged = redis::cmd("EVAL")
                            .arg(CHARGE)
                            .arg(4)
                            .arg("charges")
                            .arg("effects")
                            .arg("ledger")
                            .arg("repeats")
                            .arg(pk)
                            .arg(order_for_send)
                            .arg(now_ms())
                            .arg(amount)
                            .query_async::<Vec<u8>>(&mut con)
                            .await;
                        // The provider charged; its answer is not recorded
                        // yet. A kill here is what `call` asks about after.
                        tokio::time::sleep(slow).await;
                        charged
                    }
                },
                |_: &redis::RedisError| ErrorClass::Unanswered,
            )
            .amount(amount);
            let fp = Fingerprint::of(request.as_bytes());
            match self
                .policy
                .call_async(&self.store, &key, fp, effect)
                .await?
            {
                Run::Done(_) => self.summary.done += 1,
                Run::Reconciled(_) => self.summary.reconciled += 1,
                Run::Replayed(_) => self.summary.replayed += 1,
                Run::RetryAfter { after, .. } => {
                    tokio::time::sleep(after).await;
                    continue;
                }
                other => return Err(format!("{order}: unexpected {other:?}").into()),
            }
            break;
        }
        let _: u64 = redis::cmd("INCR")
            .arg(format!("handled:{}", self.p))
            .query_async(&mut self.ops)
            .await?;
        if self.drop_one_ack && self.dropped.is_none() {
            // Deliberately not acknowledged: redelivered later.
            self.dropped = Some(e.id.clone());
        } else {
            let _: u64 = redis::cmd("XACK")
                .arg(stream(self.p))
                .arg(GROUP)
                .arg(&e.id)
                .query_async(&mut self.ops)
                .await?;
        }
        Ok(())
    }

    /// The store's completion tallies against the ledger rows of this
    /// partition, per window.
    async fn reconciles(&mut self) -> Result<bool, BoxError> {
        let ledger: HashMap<String, String> = redis::cmd("HGETALL")
            .arg("ledger")
            .query_async(&mut self.ops)
            .await?;
        let w = WINDOW.as_millis() as u64;
        let mut theirs: HashMap<u64, (u64, i128)> = HashMap::new();
        for (order, row) in &ledger {
            if partition_of(order) != self.p {
                continue;
            }
            let mut f = row.split('|').skip(1);
            let at: u64 = f.next().ok_or("ledger row without time")?.parse()?;
            let amount: i128 = f.next().ok_or("ledger row without amount")?.parse()?;
            let t = theirs.entry(at / w * w).or_default();
            t.0 += 1;
            t.1 += amount;
        }
        let theirs: Vec<Tally> = theirs
            .into_iter()
            .map(|(start, (count, amount))| {
                Tally::new(UNIX_EPOCH + Duration::from_millis(start), count, amount)
            })
            .collect();
        let store = self.store.store().clone();
        let report =
            tokio::task::spawn_blocking(move || store.reconcile("orders", &theirs)).await??;
        Ok(report.is_clean())
    }
}

/// A consumer child: reads its settings from the environment, runs,
/// prints its summary line.
fn child(spec: &str) -> Result<(), BoxError> {
    let mut f = spec.split(',');
    let p: usize = f.next().ok_or("no partition")?.parse()?;
    let name = f.next().ok_or("no consumer name")?.to_string();
    let flags = f.next().unwrap_or("");
    let url = std::env::var(URL_ENV)?;
    let dir = std::env::var(DIR_ENV)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let summary = rt.block_on(async {
        let store = Store::builder()
            .reconcile_window(WINDOW)
            .open(std::path::Path::new(&dir).join(format!("store-{p}.redb")))?;
        let consumer = Consumer {
            p,
            name,
            store: AsyncStore::new(store),
            policy: RetryPolicy::new(),
            reader: connect(&url).await?,
            ops: connect(&url).await?,
            slow: if flags.contains("slow") {
                Duration::from_millis(20)
            } else {
                Duration::ZERO
            },
            drop_one_ack: flags.contains("drop-ack"),
            dropped: None,
            summary: Summary::default(),
        };
        consumer.run(flags.contains("reclaim")).await
    })?;
    println!("{}", summary.line());
    Ok(())
}

/// What the whole run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Entries published (duplicates included).
    pub published: usize,
    /// Ledger rows.
    pub ledger_rows: usize,
    /// Orders charged more than once by the provider.
    pub duplicate_effects: usize,
    /// Sends the provider deduplicated (a charge sent twice).
    pub repeated_sends: u64,
    /// Entries still unacknowledged.
    pub pending: u64,
    /// The consumers' summaries, the killed one left out.
    pub summaries: Vec<Summary>,
}

impl Report {
    /// Checks everything the run promises; says what failed.
    pub fn check(&self) -> Result<(), String> {
        let sum = |f: fn(&Summary) -> u64| self.summaries.iter().map(f).sum::<u64>();
        let mut wrong = Vec::new();
        if self.ledger_rows != ORDERS {
            wrong.push(format!(
                "{} ledger rows for {ORDERS} orders",
                self.ledger_rows
            ));
        }
        if self.duplicate_effects != 0 {
            wrong.push(format!("{} orders charged twice", self.duplicate_effects));
        }
        if self.repeated_sends != 0 {
            wrong.push(format!("{} charges sent twice", self.repeated_sends));
        }
        if self.pending != 0 {
            wrong.push(format!("{} entries never acknowledged", self.pending));
        }
        if sum(|s| s.replayed) == 0 {
            wrong.push("no duplicate was suppressed".into());
        }
        if sum(|s| s.reclaimed) == 0 {
            wrong.push("nothing was reclaimed from the killed consumer".into());
        }
        if sum(|s| s.redelivered) == 0 {
            wrong.push("the dropped ack was not redelivered".into());
        }
        if !self.summaries.iter().all(|s| s.clean) {
            wrong.push("a store's tallies do not reconcile with the ledger".into());
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }
}

fn spawn(
    exe: &std::path::Path,
    url: &str,
    dir: &std::path::Path,
    spec: &str,
) -> std::io::Result<Child> {
    Command::new(exe)
        .env(CHILD_ENV, spec)
        .env(URL_ENV, url)
        .env(DIR_ENV, dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
}

fn finish(child: Child, spec: &str) -> Result<Summary, BoxError> {
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("consumer {spec} failed ({}): {text}", out.status).into());
    }
    Summary::parse(&text)
        .ok_or_else(|| format!("consumer {spec} printed no summary: {text}").into())
}

/// The whole run against the Redis at `url`, with `exe` as the consumer
/// processes' binary (run with [`CHILD_ENV`] set, it is a consumer).
pub fn orchestrate(exe: &std::path::Path, url: &str) -> Result<Report, BoxError> {
    let dir = tempfile_dir()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut con = rt.block_on(connect(url))?;
    let published = rt.block_on(async {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await?;
        produce(&mut con).await
    })?;
    let mut specs = vec![
        "0,c0-first,slow".to_string(),
        "1,c1,drop-ack".to_string(),
        "2,c2".to_string(),
    ];
    let mut children: Vec<Child> = specs
        .iter()
        .map(|s| spawn(exe, url, dir.path(), s))
        .collect::<Result<_, _>>()?;
    // Kill partition 0's consumer mid-batch: once it handled 20 entries.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let handled: Option<u64> =
            rt.block_on(redis::cmd("GET").arg("handled:0").query_async(&mut con))?;
        if handled.unwrap_or(0) >= 20 {
            break;
        }
        if Instant::now() > deadline {
            return Err("partition 0's consumer never got going".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Its next charge is under way by now (each one takes 20 ms after
    // the provider charged): the kill lands inside it, most likely. It is
    // made while the consumer has entries pending (read, not acked), so
    // there is something for its successor to reclaim.
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let summary: redis::Value = rt.block_on(
            redis::cmd("XPENDING")
                .arg(stream(0))
                .arg(GROUP)
                .query_async(&mut con),
        )?;
        let pending = match summary {
            redis::Value::Array(f) => redis::from_redis_value_ref::<u64>(&f[0])?,
            _ => 0,
        };
        if pending > 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err("partition 0's consumer never had entries pending".into());
        }
    }
    children[0].kill()?; // SIGKILL
    children[0].wait()?;
    let successor = "0,c0-successor,reclaim".to_string();
    children[0] = spawn(exe, url, dir.path(), &successor)?;
    specs[0] = successor;
    let mut summaries = Vec::new();
    for (child, spec) in children.into_iter().zip(&specs) {
        summaries.push(finish(child, spec)?);
    }
    rt.block_on(async {
        let effects: HashMap<String, u64> = redis::cmd("HGETALL")
            .arg("effects")
            .query_async(&mut con)
            .await?;
        let ledger_rows: usize = redis::cmd("HLEN")
            .arg("ledger")
            .query_async(&mut con)
            .await?;
        let repeated_sends: Option<u64> = redis::cmd("GET")
            .arg("repeats")
            .query_async(&mut con)
            .await?;
        let mut pending = 0;
        for p in 0..PARTITIONS {
            let summary: redis::Value = redis::cmd("XPENDING")
                .arg(stream(p))
                .arg(GROUP)
                .query_async(&mut con)
                .await?;
            if let redis::Value::Array(f) = summary {
                pending += redis::from_redis_value_ref::<u64>(&f[0])?;
            }
        }
        Ok(Report {
            published,
            ledger_rows,
            duplicate_effects: effects.values().filter(|n| **n > 1).count(),
            repeated_sends: repeated_sends.unwrap_or(0),
            pending,
            summaries,
        })
    })
}

fn tempfile_dir() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("dedupkv-redis-").tempdir()
}

/// The `main` of the example and the test: a consumer child when
/// [`CHILD_ENV`] is set, else the whole run, printed (and `check`ed).
pub fn main() -> ExitCode {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return match child(&spec) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("consumer {spec}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let Ok(url) = std::env::var(URL_ENV) else {
        eprintln!("set {URL_ENV} (scripts/with-redis.sh does), e.g. redis://127.0.0.1:6379/");
        return ExitCode::FAILURE;
    };
    let run = std::env::current_exe()
        .map_err(BoxError::from)
        .and_then(|exe| orchestrate(&exe, &url));
    match run {
        Ok(report) => {
            println!("{report:#?}");
            match report.check() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("the run is wrong: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("the run failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A provider key the store could not give (its replica fenced, the store
/// closed) as an error of the provider's calls, which are then not made.
fn no_key_is_io(key: dedupkv::Result<String>) -> Result<String, redis::RedisError> {
    key.map_err(|e| std::io::Error::other(format!("no provider key: {e}")).into())
}
