//! `floe-kafka`: the Kafka [`Source`] — consumer-group membership through rdkafka, reading
//! from the positions committed in Iceberg rather than the group's offsets.
//!
//! Contract:
//! * the group only assigns partitions. Where a partition is read from is decided by the
//!   runtime through [`Source::seek`] (positions from the catalog); a partition without a
//!   position starts at the job's start policy (`earliest` / `latest`). Group offsets are
//!   committed after each Iceberg commit for lag monitoring only;
//! * a record before a partition's sought position is never returned. librdkafka cannot always
//!   seek a partition the instant it is assigned, so the seek is also retried when the first
//!   record of the partition shows up at another offset (and that record is dropped);
//! * every assignment change is reported as [`Polled::Rebalanced`], so the runtime drops its
//!   uncommitted work and seeks again: records are never committed by two group members.
//!
//! Its job file section, `[source.kafka]`, is [`config::RawKafka`]. The crate also holds the
//! producer of a job's exchanges ([`exchange`]) and the Kafka sink ([`mirror`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floe_core::{
    PollLimit, Polled, Positions, Source, SourceError, SourceRecord, StartAt, position_key,
};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::{ClientConfig, ClientContext, Message, Offset, Statistics, TopicPartitionList};

pub mod config;
pub mod exchange;
pub mod mirror;

/// Settings of the Kafka source.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// Consumer group; replicas of one job share it.
    pub group_id: String,
    /// Start of partitions with no committed position.
    pub start: StartAt,
    /// Topics whose partitions start at the earliest record whatever `start` says (a job's
    /// exchange topics: every record in them is the job's own).
    pub earliest_topics: Vec<String>,
    /// Other librdkafka properties (security, timeouts), passed through.
    pub properties: BTreeMap<String, String>,
}

/// Counts assignment changes and keeps the consumer lag from librdkafka's statistics; the
/// consumer's callbacks run inside `recv`.
struct GroupContext {
    generation: Arc<AtomicU64>,
    lag: Arc<Mutex<BTreeMap<String, i64>>>,
}

impl ClientContext for GroupContext {
    fn stats(&self, statistics: Statistics) {
        let mut lag = self.lag.lock().unwrap_or_else(|e| e.into_inner());
        lag.clear();
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                // -1 is the internal "unassigned" partition; lag is -1 before a commit.
                if *partition >= 0 && p.consumer_lag >= 0 {
                    lag.insert(position_key(topic, *partition), p.consumer_lag);
                }
            }
        }
    }
}

impl ConsumerContext for GroupContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions assigned")
            }
            Rebalance::Revoke(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions revoked")
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance failed"),
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// The Kafka source.
pub struct KafkaSource {
    consumer: StreamConsumer<GroupContext>,
    lag: Arc<Mutex<BTreeMap<String, i64>>>,
    generation: Arc<AtomicU64>,
    seen_generation: u64,
    start: StartAt,
    earliest_topics: Vec<String>,
    /// Partitions whose seek is not confirmed yet: the offset their next record must have, and
    /// the seeks tried.
    pending: HashMap<(Arc<str>, i32), (i64, u32)>,
    /// Next offset to accept per partition.
    next: HashMap<(Arc<str>, i32), i64>,
    topics: HashMap<String, Arc<str>>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("start", &self.start)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Joins the group and subscribes.
    pub fn connect(settings: &KafkaSettings) -> Result<Self, SourceError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.offset.reset",
                match settings.start {
                    StartAt::Earliest => "earliest",
                    StartAt::Latest => "latest",
                },
            )
            .set("client.id", "floe")
            // Prefetch at most 32 MiB (librdkafka's default is 64 MiB): part of the job's
            // memory bound. A job file may raise it.
            .set("queued.max.messages.kbytes", "32768")
            // Up to 8 MiB per partition per fetch (librdkafka's default is 1 MiB): OTLP records
            // of a whole Collector batch are large, and one round trip per few records leaves
            // the decoder waiting on a busy machine.
            .set("max.partition.fetch.bytes", "8388608")
            // When that prefetch is full, fetch again 10 ms later, not librdkafka's default of
            // a second: with a second, the job drains the prefetch faster than the fetcher
            // refills it and waits for Kafka about a third of the time (measured on the
            // service-map job: 2.1 s of every 6.8 s in `poll`, 0.06–0.3 s with 10 ms).
            .set("fetch.queue.backoff.ms", "10")
            // Statistics carry the consumer lag per partition (a job file may change it).
            .set("statistics.interval.ms", "5000");
        for (key, value) in &settings.properties {
            config.set(key, value);
        }
        let generation = Arc::new(AtomicU64::new(0));
        let lag = Arc::new(Mutex::new(BTreeMap::new()));
        let consumer: StreamConsumer<GroupContext> = config
            .create_with_context(GroupContext {
                generation: generation.clone(),
                lag: lag.clone(),
            })
            .map_err(|e| SourceError::user(format!("cannot create the Kafka consumer: {e}")))?;
        let topics: Vec<&str> = settings
            .topics
            .iter()
            .chain(&settings.earliest_topics)
            .map(String::as_str)
            .collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| SourceError::user(format!("cannot subscribe to {topics:?}: {e}")))?;
        Ok(Self {
            consumer,
            lag,
            generation,
            seen_generation: 0,
            start: settings.start,
            earliest_topics: settings.earliest_topics.clone(),
            pending: HashMap::new(),
            next: HashMap::new(),
            topics: settings
                .topics
                .iter()
                .map(|t| (t.clone(), Arc::from(t.as_str())))
                .collect(),
        })
    }

    fn topic(&mut self, name: &str) -> Arc<str> {
        self.topics
            .entry(name.to_string())
            .or_insert_with(|| Arc::from(name))
            .clone()
    }

    /// Whether a record at `offset` of `partition` is the next one to return; re-seeks a
    /// partition whose seek has not taken effect yet.
    fn accept(&mut self, key: &(Arc<str>, i32), offset: i64) -> bool {
        if let Some((wanted, attempts)) = self.pending.get(key).copied() {
            if offset < wanted || (offset > wanted && attempts < SEEK_ATTEMPTS) {
                if let Err(e) =
                    self.consumer
                        .seek(&key.0, key.1, Offset::Offset(wanted), SEEK_TIMEOUT)
                {
                    tracing::debug!(error = %e, "seek not possible yet");
                }
                self.pending.insert(key.clone(), (wanted, attempts + 1));
                return false;
            }
            if offset > wanted {
                tracing::warn!(
                    topic = %key.0,
                    partition = key.1,
                    wanted,
                    offset,
                    "records before this offset are no longer in Kafka (retention?); continuing"
                );
            }
            self.pending.remove(key);
        }
        match self.next.get(key) {
            Some(next) if offset < *next => false,
            _ => {
                self.next.insert(key.clone(), offset + 1);
                true
            }
        }
    }

    /// The offsets the start policy means now for `partitions`, in one ListOffsets request
    /// per broker (the earliest or latest "timestamp", -2 or -1) rather than a watermark query
    /// each: each of those waits behind the fetcher's long poll, half a second apiece.
    fn start_offsets(
        &self,
        partitions: &[(String, i32)],
    ) -> Result<HashMap<(String, i32), i64>, SourceError> {
        if partitions.is_empty() {
            return Ok(HashMap::new());
        }
        // As "timestamps", librdkafka sends these as ListOffsets' -2 and -1.
        let special = |topic: &str| match self.start {
            _ if self.earliest_topics.iter().any(|t| t == topic) => Offset::Beginning,
            StartAt::Earliest => Offset::Beginning,
            StartAt::Latest => Offset::End,
        };
        let mut query = TopicPartitionList::new();
        for (topic, partition) in partitions {
            query
                .add_partition_offset(topic, *partition, special(topic))
                .map_err(|e| SourceError::internal(format!("offset query: {e}")))?;
        }
        let answer = self
            .consumer
            .offsets_for_times(query, Duration::from_secs(10))
            .map_err(|e| SourceError::external(format!("cannot read the start offsets: {e}")))?;
        let mut offsets = HashMap::new();
        for element in answer.elements() {
            let what = format!("{}/{}", element.topic(), element.partition());
            if let Err(e) = element.error() {
                return Err(SourceError::external(format!(
                    "cannot read the offsets of {what}: {e}"
                )));
            }
            let Offset::Offset(offset) = element.offset() else {
                return Err(SourceError::external(format!(
                    "no start offset for {what}: {:?}",
                    element.offset()
                )));
            };
            offsets.insert((element.topic().to_string(), element.partition()), offset);
        }
        Ok(offsets)
    }
}

/// Seeks retried before a partition's first record is taken as the oldest still available.
const SEEK_ATTEMPTS: u32 = 3;

/// Seeks are asynchronous: librdkafka bumps the partition's version barrier before it
/// returns — records fetched from the old position are discarded on the way out — and a
/// synchronous seek only adds the wait for the fetcher's reply, which sits behind the
/// broker's long poll (`fetch.wait.max.ms`, 500 ms by default): measured, half a second to a
/// second per restart or rebalance. A seek that did not take is caught by [`KafkaSource::accept`]
/// on the partition's first record.
const SEEK_TIMEOUT: Duration = Duration::ZERO;

impl Source for KafkaSource {
    async fn poll(
        &mut self,
        out: &mut Vec<SourceRecord>,
        limit: PollLimit,
        timeout: Duration,
    ) -> Result<Polled, SourceError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let first = out.len();
        let mut bytes = 0;
        while out.len() < limit.records && bytes < limit.bytes {
            // Wait (up to the timeout) for the first record only; after it, take what librdkafka
            // has already fetched and return, so decoding never idles while records wait.
            // (`timeout_at` polls the receive before looking at the clock.)
            let until = if out.len() == first {
                deadline
            } else {
                tokio::time::Instant::now()
            };
            let message = match tokio::time::timeout_at(until, self.consumer.recv()).await {
                Err(_) => break,
                Ok(Err(e)) => {
                    // Transient broker errors are retried by librdkafka; report and go on.
                    tracing::warn!(error = %e, "Kafka consumer error");
                    continue;
                }
                Ok(Ok(message)) => message,
            };
            let generation = self.generation.load(Ordering::SeqCst);
            if generation != self.seen_generation {
                // This record may belong to the new assignment, read from the group's offset;
                // the runtime seeks and it comes again.
                self.seen_generation = generation;
                return Ok(Polled::Rebalanced);
            }
            let (topic, partition, offset) = (
                message.topic().to_string(),
                message.partition(),
                message.offset(),
            );
            let payload = message.payload().map(<[u8]>::to_vec).unwrap_or_default();
            let record_key = message.key().map(<[u8]>::to_vec);
            drop(message);
            let key = (self.topic(&topic), partition);
            if self.accept(&key, offset) {
                bytes += payload.len();
                out.push(SourceRecord {
                    topic: key.0,
                    partition,
                    offset,
                    payload,
                    key: record_key,
                });
            }
        }
        let generation = self.generation.load(Ordering::SeqCst);
        if generation != self.seen_generation {
            self.seen_generation = generation;
            return Ok(Polled::Rebalanced);
        }
        Ok(Polled::Records)
    }

    fn assignment(&self) -> Vec<String> {
        self.consumer
            .assignment()
            .map(|tpl| {
                tpl.elements()
                    .iter()
                    .map(|e| position_key(e.topic(), e.partition()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn seek(&mut self, positions: &Positions) -> Result<(), SourceError> {
        let assignment = self
            .consumer
            .assignment()
            .map_err(|e| SourceError::internal(format!("cannot read the assignment: {e}")))?;
        self.pending.clear();
        self.next.clear();
        let committed = |topic: &str, partition: i32| {
            positions
                .get(&position_key(topic, partition))
                .and_then(|v| v.parse::<i64>().ok())
        };
        let unknown: Vec<(String, i32)> = assignment
            .elements()
            .iter()
            .filter(|e| committed(e.topic(), e.partition()).is_none())
            .map(|e| (e.topic().to_string(), e.partition()))
            .collect();
        let starts = self.start_offsets(&unknown)?;
        for element in assignment.elements() {
            let topic = self.topic(element.topic());
            let partition = element.partition();
            let key = position_key(&topic, partition);
            let next = match committed(&topic, partition) {
                Some(next) => next,
                None => *starts
                    .get(&(topic.to_string(), partition))
                    .ok_or_else(|| SourceError::external(format!("no start offset for {key}")))?,
            };
            self.next.insert((topic.clone(), partition), next);
            self.pending.insert((topic.clone(), partition), (next, 0));
            if let Err(e) =
                self.consumer
                    .seek(&topic, partition, Offset::Offset(next), SEEK_TIMEOUT)
            {
                tracing::debug!(%key, error = %e, "seek deferred to the first record");
            }
        }
        Ok(())
    }

    fn acknowledge(&mut self, positions: &Positions) {
        let mut tpl = TopicPartitionList::new();
        for (key, next) in positions {
            let (Some((topic, partition)), Ok(next)) = (key.rsplit_once('/'), next.parse::<i64>())
            else {
                continue;
            };
            let Ok(partition) = partition.parse::<i32>() else {
                continue;
            };
            let key = (self.topic(topic), partition);
            if self.next.contains_key(&key) {
                let _ = tpl.add_partition_offset(topic, partition, Offset::Offset(next));
            }
        }
        if tpl.count() > 0
            && let Err(e) = self
                .consumer
                .commit(&tpl, rdkafka::consumer::CommitMode::Async)
        {
            tracing::debug!(error = %e, "could not commit group offsets (advisory)");
        }
    }

    fn lag(&self) -> Vec<(String, i64)> {
        let lag = self.lag.lock().unwrap_or_else(|e| e.into_inner());
        lag.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}
