//! dedupkv's Kafka glue: a consumer group's rebalances drive a
//! [`PartitionSet`], so each partition's dedup store moves with the
//! partition (its replica in object storage goes with it).
//!
//! Give a [`GroupContext`] to `rdkafka`'s `create_with_context`; it
//! revokes the partitions the group takes away (waiting for their work in
//! flight, shipping the tail, closing) before librdkafka gives them up,
//! and assigns the ones it hands over (taking their replica over, fencing
//! the earlier owner, restoring when needed) before librdkafka fetches
//! from them. The handler then follows the order of the consumer-group
//! pattern in `docs/consumer-groups.md`: poll, `begin_batch`, the effect,
//! `complete_batch`, commit the offsets.
//!
//! `tests/group_run/` runs it end to end against `librdkafka`'s mock
//! cluster: consumer processes killed (SIGKILL) mid-batch, a rolling deploy and a
//! lost disk, in both replica modes.
//!
//! # Examples
//! ```no_run
//! use dedupkv::partitions::PartitionSet;
//! use dedupkv::replica::{Replica, object_store::local::LocalFileSystem};
//! use dedupkv_kafka::GroupContext;
//! use rdkafka::consumer::{BaseConsumer, Consumer};
//! use std::{sync::Arc, time::Duration};
//!
//! let objects = Arc::new(LocalFileSystem::new_with_prefix("/mnt/replicas")?);
//! let set = PartitionSet::new("/var/lib/orders", move |p| {
//!     Ok(dedupkv::Store::builder().replica(Replica::new(objects.clone(), &format!("orders/{p}"))))
//! });
//! let consumer: BaseConsumer<GroupContext> = rdkafka::ClientConfig::new()
//!     .set("bootstrap.servers", "localhost:9092")
//!     .set("group.id", "orders")
//!     .set("enable.auto.commit", "false")
//!     .create_with_context(GroupContext::new(set.clone(), "orders", Duration::from_secs(30)))?;
//! consumer.subscribe(&["orders"])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::{Duration, SystemTime};

use dedupkv::partitions::{Assigned, PartitionSet, Revoked};
use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::topic_partition_list::TopicPartitionList;

/// What a [`GroupContext`] did at a rebalance, for its observer.
#[derive(Debug)]
#[non_exhaustive]
pub enum GroupEvent<'a> {
    /// A revoke of `partition` starts (new work for it is refused from now).
    RevokeStarted {
        /// The partition.
        partition: i32,
        /// When.
        at: SystemTime,
    },
    /// A revoke ended.
    Revoked {
        /// The partition.
        partition: i32,
        /// What it did, or why it failed (the partition left the set
        /// either way, unless it was not in it).
        result: &'a dedupkv::Result<Revoked>,
    },
    /// An assign ended.
    Assigned {
        /// The partition.
        partition: i32,
        /// What it did (and restored), or why it failed (then the
        /// partition is not served here: its messages are refused with
        /// `Error::NotAssigned`).
        result: &'a dedupkv::Result<Assigned>,
    },
}

type Observer = dyn Fn(&GroupEvent<'_>) + Send + Sync;

/// An `rdkafka` consumer context whose rebalance callbacks drive a
/// [`PartitionSet`]: revoked partitions are revoked from it before the
/// consumer gives them up, assigned ones assigned before it fetches.
///
/// # Examples
/// See the [crate docs](crate).
pub struct GroupContext {
    set: PartitionSet,
    topic: String,
    deadline: Duration,
    assign_tries: u32,
    observer: Option<Box<Observer>>,
}

impl GroupContext {
    /// A context for `topic`'s partitions (other topics' partitions are
    /// left alone) driving `set`; each revoke waits up to `deadline` for
    /// the partition's work in flight.
    ///
    /// # Examples
    /// See the [crate docs](crate).
    pub fn new(set: PartitionSet, topic: &str, deadline: Duration) -> GroupContext {
        GroupContext {
            set,
            topic: topic.to_string(),
            deadline,
            assign_tries: 5,
            observer: None,
        }
    }

    /// Calls `f` at each step of a rebalance (for logs and measurements).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// # let set = PartitionSet::new("/tmp/x", |_| Ok(dedupkv::Store::builder()));
    /// let ctx = dedupkv_kafka::GroupContext::new(set, "orders", std::time::Duration::from_secs(30))
    ///     .observe(|e| eprintln!("{e:?}"));
    /// ```
    #[must_use]
    pub fn observe(mut self, f: impl Fn(&GroupEvent<'_>) + Send + Sync + 'static) -> Self {
        self.observer = Some(Box::new(f));
        self
    }

    /// The partition set it drives.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::partitions::PartitionSet;
    /// # let set = PartitionSet::new("/tmp/x", |_| Ok(dedupkv::Store::builder()));
    /// let ctx = dedupkv_kafka::GroupContext::new(set, "orders", std::time::Duration::from_secs(30));
    /// assert!(ctx.set().assigned().is_empty());
    /// ```
    pub fn set(&self) -> &PartitionSet {
        &self.set
    }

    fn tell(&self, e: &GroupEvent<'_>) {
        if let Some(f) = &self.observer {
            f(e);
        }
    }

    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements_for_topic(&self.topic)
            .iter()
            .map(rdkafka::topic_partition_list::TopicPartitionListElem::partition)
            .collect()
    }

    fn revoke(&self, tpl: &TopicPartitionList) {
        for partition in self.partitions(tpl) {
            self.tell(&GroupEvent::RevokeStarted {
                partition,
                at: SystemTime::now(),
            });
            let result = self.set.revoke(partition, self.deadline);
            if let Err(e) = &result {
                tracing::warn!(partition, error = %e, "dedupkv revoke failed");
            }
            self.tell(&GroupEvent::Revoked {
                partition,
                result: &result,
            });
        }
    }

    fn assign(&self, tpl: &TopicPartitionList) {
        for partition in self.partitions(tpl) {
            // The group's assignment is its word that this member owns the
            // partition now, so a partition fenced here before is taken
            // again (`assign` would refuse it).
            let mut result = self.set.assign_after_fence(partition);
            // Another member taking the same epoch at the same moment (a
            // rebalance racing a slow revoke elsewhere) loses cleanly:
            // try again, the next epoch is free.
            for _ in 1..self.assign_tries {
                if !matches!(result, Err(dedupkv::Error::Fenced(_))) {
                    break;
                }
                result = self.set.assign_after_fence(partition);
            }
            if let Err(e) = &result {
                tracing::warn!(partition, error = %e, "dedupkv assign failed");
            }
            self.tell(&GroupEvent::Assigned {
                partition,
                result: &result,
            });
        }
    }
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    /// Before librdkafka gives partitions up: revoke them (their handlers'
    /// work finishes or is refused, the tail is shipped, the stores
    /// close), so the next owner restores everything acknowledged here.
    /// Before it starts fetching new ones: assign them (ownership, fence,
    /// restore, open), so the first message finds its store.
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => self.revoke(tpl),
            Rebalance::Assign(tpl) => self.assign(tpl),
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
    }
}
