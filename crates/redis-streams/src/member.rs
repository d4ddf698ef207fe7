//! One member of the consumer group, run as a child process: a
//! [`PartitionSet`] whose partitions (streams) the coordinator assigns and
//! revokes through this process's stdin, and a loop that reads the
//! assigned streams with `XREADGROUP`, charges each order through
//! [`RetryPolicy::call_async`] and acknowledges with `XACK` after the
//! store's record.
//!
//! Why this order is safe, at a crash between each pair of steps:
//! - after the claim, before the charge: the claim (and its intent) is in
//!   the store and, in synchronous mode, in the replica; the next owner
//!   reclaims the entry (`XAUTOCLAIM`), takes the claim over as
//!   interrupted, asks the provider (not found) and charges;
//! - after the charge, before its record: the same, and the provider has
//!   the charge under the claim's provider key: the next owner finds it
//!   and completes with it (`Run::Reconciled`), never charging twice;
//! - after the record, before the `XACK`: the entry is reclaimed and the
//!   store answers it from its record (`Run::Replayed`);
//! - after the `XACK`: nothing is redelivered; a later copy of the order
//!   is answered from the record.
//!
//! In asynchronous mode the replica lags: a member killed before its
//! claims were shipped leaves its successor without them, and only the
//! provider's deduplication by a key the successor computes the same way
//! keeps the charge single (see [`carrier_key`](crate::provider::carrier_key)).
//!
//! Invariants:
//! - one thread does everything (commands, reads, charges, acks), so a
//!   revoke never overlaps a charge: when `revoke` runs, no [`Work`](dedupkv::partitions::Work)
//!   handle is alive and every handled entry but a deliberately dropped
//!   one is acknowledged;
//! - the [`AsyncStore`] a charge runs on wraps the partition's store only
//!   while the charge's [`Work`](dedupkv::partitions::Work) handle is alive (the partition set has
//!   no async face; by the first invariant no revoke can run meanwhile);
//! - a partition whose store answers [`Error::Fenced`] or
//!   [`Error::NotAssigned`] is no longer worked here: its entries stay
//!   pending for its owner, and it is not assigned again on our own.

use std::collections::BTreeSet;
use std::future::Future;
use std::io::BufRead;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc;
use std::task::Poll;
use std::time::{Duration, Instant};

use dedupkv::partitions::PartitionSet;
use dedupkv::replica::object_store::{ObjectStore, local::LocalFileSystem};
use dedupkv::replica::{Replica, ReplicaMode};
use dedupkv::{AsyncStore, Durability, Error, Fingerprint, Key, RetryPolicy, Run, Store, Tally};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};

use crate::provider::{Books, Charge, charged_by};
use crate::{BoxError, GROUP, WINDOW, now_us, partition_of, stream};

/// A pending entry idle this long is reclaimed by its stream's owner (a
/// dropped ack).
const RECLAIM_IDLE_MS: u64 = 300;
/// How long a revoke waits for work in flight (none, by the invariants).
const REVOKE_DEADLINE: Duration = Duration::from_secs(60);

/// The member's settings, from its environment (the coordinator sets
/// them).
pub(crate) struct Settings {
    pub member: String,
    pub mode: ReplicaMode,
    pub ns: String,
    pub base: PathBuf,
    pub bucket: PathBuf,
    pub url: String,
    /// Skip the `XACK` of one entry (a dropped ack, reclaimed later).
    pub drop_ack: bool,
}

/// Where the run stops for the coordinator's SIGKILL, once armed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pause {
    /// After the provider charged, before its answer is recorded.
    Mid,
    /// After the record, before the `XACK`.
    Complete,
}

/// A line for the coordinator, on stdout (line-buffered: a SIGKILL leaves
/// whole lines).
fn say(s: &str) {
    println!("{s}");
}

/// Logs the replica lag of every store of the set (bytes summed, the
/// oldest unshipped commit's wait at most), then stops for the kill.
fn pause_here(set: &PartitionSet, p: i32, order: &str) -> ! {
    let (mut bytes, mut oldest) = (0, 0);
    for q in set.assigned() {
        let status = set.work(q).and_then(|w| w.with(|s| Ok(s.replica_status())));
        if let Ok(Some(s)) = status {
            bytes += s.lag_bytes;
            oldest = oldest.max(s.lag.as_micros());
        }
    }
    say(&format!(
        "pause {p} {} {order} lag_bytes={bytes} lag_us={oldest}",
        now_us()
    ));
    loop {
        std::thread::park();
    }
}

struct Member {
    s: Settings,
    /// `member@pid`: the consumer name in the group, and the charges'
    /// author.
    me: String,
    set: PartitionSet,
    policy: RetryPolicy,
    books: Books,
    reader: MultiplexedConnection,
    ops: MultiplexedConnection,
    /// The partitions worked here.
    owned: BTreeSet<i32>,
    /// Assigned and not answered yet (for the hand-over time).
    fresh: BTreeSet<i32>,
    armed: Option<Pause>,
    dropped: bool,
    last_reclaim: Instant,
}

/// What became of one charge.
enum Charged {
    /// Answered (how, and the charge's reference): acknowledge the entry.
    Answered(&'static str, Vec<u8>),
    /// The partition is not ours any more: leave the entry pending.
    Gone(Error),
}

/// A charge under way.
type Pending<'a> = Pin<Box<dyn Future<Output = Result<Charged, BoxError>> + 'a>>;

/// Awaits every future of `futs`, side by side; answers their outputs in
/// order.
async fn join_all<T>(futs: Vec<Pin<Box<dyn Future<Output = T> + '_>>>) -> Vec<T> {
    let mut futs: Vec<_> = futs.into_iter().map(Some).collect();
    let mut out: Vec<Option<T>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, o) in futs.iter_mut().zip(out.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *o = Some(v);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

impl Member {
    async fn command(&mut self, line: &str) -> Result<bool, BoxError> {
        let mut w = line.split(' ');
        let (verb, arg) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
        match verb {
            "assign" => self.assign(arg.parse()?).await?,
            "revoke" => self.revoke(arg.parse()?),
            "arm" => {
                self.armed = Some(if arg == "mid" {
                    Pause::Mid
                } else {
                    Pause::Complete
                });
            }
            "stop" => return Ok(false),
            _ => return Err(format!("unknown command {line:?}").into()),
        }
        Ok(true)
    }

    async fn assign(&mut self, p: i32) -> Result<(), BoxError> {
        let result = self.set.assign(p);
        let what = match &result {
            Ok(a) => format!(
                "ok epoch={} restored={} took_us={}",
                a.epoch,
                a.restored
                    .as_ref()
                    .map_or_else(|| "none".to_string(), |r| format!("{:?}", r.reason)),
                a.took.as_micros()
            ),
            Err(e) => format!("err {}", e.to_string().replace(' ', "_")),
        };
        say(&format!("assign {p} {} {what}", now_us()));
        if result.is_err() {
            return Ok(());
        }
        self.owned.insert(p);
        self.fresh.insert(p);
        // The earlier owner's pending entries (all of them: it was
        // revoked, or it is dead and fenced by this assign) are ours now.
        let pending = self.autoclaim(p, 0).await?;
        say(&format!("reclaim {p} {} n={}", now_us(), pending.len()));
        self.batch(p, &pending, true).await?;
        Ok(())
    }

    fn revoke(&mut self, p: i32) {
        say(&format!("revoke_start {p} {}", now_us()));
        self.owned.remove(&p);
        self.fresh.remove(&p);
        let what = match self.set.revoke(p, REVOKE_DEADLINE) {
            Ok(r) => format!("ok abandoned={}", r.abandoned),
            Err(e) => format!("err {}", e.to_string().replace(' ', "_")),
        };
        say(&format!("revoke_done {p} {} {what}", now_us()));
    }

    /// No longer works `p` (fenced, or refused): its entries stay pending
    /// for its owner.
    fn lose(&mut self, p: i32, why: &Error) {
        if self.owned.remove(&p) {
            say(&format!(
                "fenced {p} {} {}",
                now_us(),
                why.to_string().replace(' ', "_")
            ));
        }
    }

    async fn autoclaim(&mut self, p: i32, min_idle: u64) -> Result<Vec<StreamId>, BoxError> {
        let mut out = Vec::new();
        let mut start = "0-0".to_string();
        loop {
            let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(stream(&self.s.ns, p))
                .arg(GROUP)
                .arg(&self.me)
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

    /// Handles a batch of stream `p`'s entries: their charges side by side
    /// (their commits share the store's group commits), then, once every
    /// answer is recorded, one `XACK` for the batch.
    async fn batch(
        &mut self,
        p: i32,
        entries: &[StreamId],
        reclaimed: bool,
    ) -> Result<(), BoxError> {
        if entries.is_empty() || !self.owned.contains(&p) {
            return Ok(());
        }
        let mut items = Vec::with_capacity(entries.len());
        for e in entries {
            let order: String = e.get("order").ok_or("an entry without an order")?;
            let amount: i64 = e.get("amount").ok_or("an entry without an amount")?;
            items.push((e.id.clone(), order, amount));
        }
        let work = match self.set.work(p) {
            Ok(w) => w,
            Err(err) => {
                self.lose(p, &err);
                return Ok(());
            }
        };
        // Scoped to `work`: see the module's invariants.
        let store = match work.with(|s| Ok(AsyncStore::new(s.clone()))) {
            Ok(s) => s,
            Err(err) => {
                self.lose(p, &err);
                return Ok(());
            }
        };
        let charges: Vec<_> = items
            .iter()
            .map(|(_, order, amount)| {
                Box::pin(self.charge(&store, p, order, *amount)) as Pending<'_>
            })
            .collect();
        let answers = join_all(charges).await;
        let mut acks = Vec::new();
        let mut gone = None;
        for ((id, order, _), answer) in items.iter().zip(answers) {
            match answer? {
                Charged::Answered(kind, reference) => {
                    say(&format!(
                        "run {p} {} {order} {id} {kind} {} reclaimed={}",
                        now_us(),
                        charged_by(&reference),
                        u8::from(reclaimed)
                    ));
                    acks.push(id.clone());
                }
                Charged::Gone(err) => gone = Some(err),
            }
        }
        if self.armed == Some(Pause::Complete)
            && let Some((_, order, _)) = items.first()
        {
            // Recorded, not acknowledged.
            pause_here(&self.set, p, order);
        }
        drop(store);
        drop(work);
        if let Some(err) = gone {
            self.lose(p, &err);
        }
        if !acks.is_empty() && self.fresh.remove(&p) {
            say(&format!("first {p} {}", now_us()));
        }
        if self.s.drop_ack && !self.dropped && !reclaimed && !acks.is_empty() {
            // Deliberately not acknowledged: reclaimed once idle.
            self.dropped = true;
            let id = acks.remove(0);
            say(&format!("dropped_ack {p} {} {id}", now_us()));
        }
        if !acks.is_empty() {
            let _: u64 = redis::cmd("XACK")
                .arg(stream(&self.s.ns, p))
                .arg(GROUP)
                .arg(&acks)
                .query_async(&mut self.ops.clone())
                .await?;
        }
        Ok(())
    }

    /// One order's charge through the policy, on the partition's store.
    async fn charge(
        &self,
        store: &AsyncStore,
        p: i32,
        order: &str,
        amount: i64,
    ) -> Result<Charged, BoxError> {
        let key = Key::new("orders", order);
        let request = format!("charge {amount} cents for {order}");
        let fp = Fingerprint::of(request.as_bytes());
        let give_up = Instant::now() + Duration::from_secs(120);
        while Instant::now() < give_up {
            let after_send: Box<dyn FnOnce()> = if self.armed == Some(Pause::Mid) {
                let (set, order) = (self.set.clone(), order.to_string());
                Box::new(move || pause_here(&set, p, &order))
            } else {
                Box::new(|| {})
            };
            let charge = Charge {
                books: &self.books,
                con: &self.ops,
                order,
                amount,
                by: &self.me,
                request: request.as_bytes(),
            };
            let run = self
                .policy
                .call_async(store, &key, fp, charge.effect(after_send))
                .await;
            return Ok(match run {
                Ok(Run::Done(r)) => Charged::Answered("done", r),
                Ok(Run::Reconciled(r)) => Charged::Answered("reconciled", r),
                Ok(Run::Replayed(r)) => Charged::Answered("replayed", r),
                Ok(Run::RetryAfter { after, error, .. }) => {
                    eprintln!(
                        "member {}: {order} on {p}: retry after {after:?}: {error}",
                        self.me
                    );
                    tokio::time::sleep(after.min(Duration::from_millis(100))).await;
                    continue;
                }
                Ok(Run::InProgress { retry_after, .. }) => {
                    // A copy of the order in the same batch holds it.
                    tokio::time::sleep(retry_after.min(Duration::from_millis(20))).await;
                    continue;
                }
                Ok(other) => return Err(format!("{order} on {p}: unexpected {other:?}").into()),
                Err(err @ (Error::Fenced(_) | Error::NotAssigned { .. })) => Charged::Gone(err),
                Err(err) => return Err(format!("{order} on {p}: {err}").into()),
            });
        }
        Err(format!("{order} on {p}: no answer within 120 s").into())
    }

    /// One pass: the assigned streams' new entries, and, now and then,
    /// their idle pending ones (a dropped ack).
    async fn poll(&mut self) -> Result<(), BoxError> {
        let owned: Vec<i32> = self.owned.iter().copied().collect();
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(&self.me)
            .arg("COUNT")
            .arg(64)
            .arg("BLOCK")
            .arg(50)
            .arg("STREAMS");
        for p in &owned {
            cmd.arg(stream(&self.s.ns, *p));
        }
        for _ in &owned {
            cmd.arg(">");
        }
        let reply: Option<StreamReadReply> = cmd.query_async(&mut self.reader).await?;
        for k in reply.map(|r| r.keys).unwrap_or_default() {
            let p = partition_of_stream(&k.key)?;
            self.batch(p, &k.ids, false).await?;
        }
        if self.last_reclaim.elapsed() >= Duration::from_millis(RECLAIM_IDLE_MS) {
            self.last_reclaim = Instant::now();
            for p in owned {
                let idle = self.autoclaim(p, RECLAIM_IDLE_MS).await?;
                self.batch(p, &idle, true).await?;
            }
        }
        Ok(())
    }

    /// The stores' completion tallies against the ledger rows of each
    /// partition still worked here, per window.
    async fn tallies(&mut self) -> Result<(), BoxError> {
        let ledger: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&self.books.ledger)
            .query_async(&mut self.ops)
            .await?;
        let w = WINDOW.as_millis() as u64;
        for p in self.owned.clone() {
            let mut theirs: std::collections::HashMap<u64, (u64, i128)> =
                std::collections::HashMap::new();
            for (order, row) in &ledger {
                if partition_of(order) != p {
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
                    Tally::new(
                        std::time::UNIX_EPOCH + Duration::from_millis(start),
                        count,
                        amount,
                    )
                })
                .collect();
            let clean = self
                .set
                .work(p)
                .and_then(|w| w.with(|s| s.reconcile("orders", &theirs)));
            let what = match clean {
                Ok(r) if r.is_clean() => "clean".to_string(),
                Ok(r) => {
                    let d: Vec<String> = r
                        .differences()
                        .map(|w| {
                            format!(
                                "store={}/{}_ledger={}/{}",
                                w.ours.0, w.ours.1, w.theirs.0, w.theirs.1
                            )
                        })
                        .collect();
                    format!("dirty {}", d.join(","))
                }
                Err(e) => format!("err {}", e.to_string().replace(' ', "_")),
            };
            say(&format!("tally {p} {} {what}", now_us()));
        }
        Ok(())
    }
}

fn partition_of_stream(key: &str) -> Result<i32, BoxError> {
    Ok(key
        .rsplit_once(':')
        .ok_or_else(|| format!("stream {key:?} has no partition"))?
        .1
        .parse()?)
}

/// The member's life: start, obey the coordinator's commands between
/// passes, and on `stop` (or the end of stdin) check its stores' tallies,
/// revoke everything (shipping each tail) and exit.
pub(crate) fn run(s: Settings) -> Result<(), BoxError> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                return;
            }
        }
        let _ = tx.send("stop".into());
    });
    let objects: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&s.bucket)?);
    let (mode, label, ns) = (s.mode, s.member.clone(), s.ns.clone());
    let set = PartitionSet::new(&s.base, move |p| {
        let replica = Replica::new(Arc::clone(&objects), &format!("{ns}/orders/{p}"))
            .mode(mode)
            .owner_label(&label);
        Ok(Store::builder()
            .durability(Durability::Immediate)
            .reconcile_window(WINDOW)
            .replica(replica))
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut m = Member {
            me: format!("{}@{}", s.member, std::process::id()),
            books: Books::new(&s.ns),
            reader: crate::connect(&s.url).await?,
            ops: crate::connect(&s.url).await?,
            s,
            set,
            policy: RetryPolicy::new(),
            owned: BTreeSet::new(),
            fresh: BTreeSet::new(),
            armed: None,
            dropped: false,
            last_reclaim: Instant::now(),
        };
        say(&format!("start {} {}", m.me, now_us()));
        'life: loop {
            let mut commands: Vec<String> = rx.try_iter().collect();
            if commands.is_empty() && m.owned.is_empty() {
                // Nothing to read: wait for the coordinator (bounded, so
                // the loop stays alive).
                commands.extend(rx.recv_timeout(Duration::from_millis(50)));
            }
            for c in commands {
                if !m.command(&c).await? {
                    break 'life;
                }
            }
            if !m.owned.is_empty() {
                m.poll().await?;
            }
        }
        m.tallies().await?;
        for (p, r) in m.set.revoke_all(REVOKE_DEADLINE) {
            say(&format!(
                "revoke_done {p} {} {}",
                now_us(),
                match r {
                    Ok(_) => "ok".to_string(),
                    Err(e) => format!("err {}", e.to_string().replace(' ', "_")),
                }
            ));
        }
        say(&format!("exit {} {}", m.me, now_us()));
        Ok::<(), BoxError>(())
    })
}
