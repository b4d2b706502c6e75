//! A Kafka topic as a [`Mirror`] of a committed table: each snapshot's rows in one Kafka
//! transaction, so a `read_committed` consumer sees every row of a committed checkpoint once
//! (ADR 0010).
//!
//! * **Records.** One per row: the row as a JSON object (`arrow-json`'s encoding: timestamps
//!   as RFC 3339 text, lists as arrays), keyed by the configured column's value, with headers
//!   `floe-seq` (the snapshot's sequence number), `floe-snapshot`, `floe-table` (the table's
//!   UUID) and `floe-row` (its index in the snapshot), all decimal text but the UUID.
//! * **Fencing.** The producer's `transactional.id` is the job's and the sink's
//!   (`floe.<job>.<sink>`): [`claim`](Mirror::claim) runs `init_transactions`, which aborts
//!   whatever an earlier producer of that id left open and fences it for good.
//! * **What was delivered** is read after that, from the topic itself: the newest `floe-seq`
//!   among the committed records of each partition's tail (reading back until a record with
//!   one shows up).
//!
//! librdkafka's transactional calls block, so they run on tokio's blocking threads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floe_core::mirror::Mirroring;
use floe_core::{Delivery, Mirror, SourceError};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Header names of a mirrored record.
pub const SEQUENCE_HEADER: &str = "floe-seq";
/// The snapshot id header.
pub const SNAPSHOT_HEADER: &str = "floe-snapshot";
/// The table UUID header.
pub const TABLE_HEADER: &str = "floe-table";
/// The row index header.
pub const ROW_HEADER: &str = "floe-row";

/// How long a transactional call may take.
const TXN_TIMEOUT: Duration = Duration::from_secs(60);

/// What a Kafka mirror needs.
#[derive(Debug, Clone)]
pub struct KafkaMirrorSettings {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// The column whose value keys each record.
    pub key: Option<String>,
    /// Partitions of a topic the mirror creates.
    pub partitions: i32,
    /// `transactional.id`, stable across restarts.
    pub transactional_id: String,
    /// Other librdkafka properties.
    pub properties: BTreeMap<String, String>,
}

/// A Kafka topic mirroring a table.
pub struct KafkaMirror {
    settings: KafkaMirrorSettings,
    /// The claimed producer.
    producer: Arc<Mutex<Option<BaseProducer>>>,
}

impl std::fmt::Debug for KafkaMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaMirror")
            .field("topic", &self.settings.topic)
            .finish_non_exhaustive()
    }
}

fn external(what: &str, e: impl std::fmt::Display) -> SourceError {
    SourceError::external(format!("{what}: {e}"))
}

impl KafkaMirror {
    /// A mirror into `settings.topic`; nothing connects before [`claim`](Mirror::claim).
    pub fn new(settings: KafkaMirrorSettings) -> Self {
        Self {
            settings,
            producer: Arc::new(Mutex::new(None)),
        }
    }

    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.settings.brokers);
        for (key, value) in &self.settings.properties {
            config.set(key, value);
        }
        config
    }
}

/// Creates `topic` with `partitions` unless it exists.
async fn ensure_topic(
    config: &ClientConfig,
    topic: &str,
    partitions: i32,
) -> Result<(), SourceError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = config
        .create()
        .map_err(|e| SourceError::user(format!("cannot create a Kafka admin client: {e}")))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics([&new], &options)
        .await
        .map_err(|e| external(&format!("cannot create topic {topic}"), e))?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(%topic, partitions, "sink topic created"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(external(&format!("cannot create topic {name}"), code));
            }
        }
    }
    Ok(())
}

/// The header `name` of `message`, as text.
fn header<'a>(message: &'a impl Message, name: &str) -> Option<&'a str> {
    message
        .headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

/// The newest (table UUID, sequence) among the committed records at the end of `topic`.
fn read_tail(config: &ClientConfig, topic: &str) -> Result<Option<(String, i64)>, SourceError> {
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", format!("floe-sink-tail-{topic}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(|e| external("cannot create a consumer", e))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| external(&format!("cannot read topic {topic}"), e))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut newest: Option<(String, i64)> = None;
    for partition in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .map_err(|e| external(&format!("cannot read {topic}/{partition}"), e))?;
        // Transaction markers take offsets too: read further back until a record shows up.
        let mut back = 16;
        loop {
            let start = (high - back).max(low);
            if start >= high {
                break;
            }
            let found = scan(&consumer, topic, partition, start)?;
            if let Some((uuid, sequence)) = found {
                if newest.as_ref().is_none_or(|n| sequence > n.1) {
                    newest = Some((uuid, sequence));
                }
                break;
            }
            if start == low {
                break;
            }
            back *= 8;
        }
    }
    Ok(newest)
}

/// The newest mirrored record of `partition` from `start` to its end.
fn scan(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    start: i64,
) -> Result<Option<(String, i64)>, SourceError> {
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(start))
        .map_err(|e| external("cannot assign", e))?;
    consumer
        .assign(&assignment)
        .map_err(|e| external("cannot assign", e))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut found: Option<(String, i64)> = None;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(found),
            Some(Err(e)) => return Err(external(&format!("cannot read {topic}/{partition}"), e)),
            Some(Ok(message)) => {
                let sequence = header(&message, SEQUENCE_HEADER).and_then(|s| s.parse().ok());
                if let (Some(sequence), Some(uuid)) = (sequence, header(&message, TABLE_HEADER))
                    && found.as_ref().is_none_or(|f| sequence >= f.1)
                {
                    found = Some((uuid.to_string(), sequence));
                }
            }
        }
    }
    Err(SourceError::external(format!(
        "reading the end of {topic}/{partition} took over a minute"
    )))
}

/// The rows of `delivery` as JSON objects, one per row.
fn encode(delivery: &Delivery) -> Result<Vec<Vec<u8>>, SourceError> {
    let mut rows = Vec::with_capacity(delivery.rows());
    for batch in &delivery.batches {
        let mut buffer = Vec::new();
        let mut writer = arrow_json::LineDelimitedWriter::new(&mut buffer);
        writer
            .write(batch)
            .map_err(|e| SourceError::internal(format!("cannot encode rows as JSON: {e}")))?;
        writer
            .finish()
            .map_err(|e| SourceError::internal(format!("cannot encode rows as JSON: {e}")))?;
        rows.extend(
            buffer
                .split(|b| *b == b'\n')
                .filter(|line| !line.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    Ok(rows)
}

/// The key of a JSON row: the column's value as text (`None` when null or absent).
fn key_of(row: &[u8], column: &str) -> Option<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_slice(row).ok()?;
    match value.get(column)? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone().into_bytes()),
        other => Some(other.to_string().into_bytes()),
    }
}

/// One snapshot in one transaction.
fn send_transaction(
    producer: &BaseProducer,
    settings: &KafkaMirrorSettings,
    delivery: &Delivery,
    rows: &[Vec<u8>],
) -> Result<(), KafkaError> {
    producer.begin_transaction()?;
    let (sequence, snapshot) = (
        delivery.sequence.to_string(),
        delivery.snapshot_id.to_string(),
    );
    for (index, payload) in rows.iter().enumerate() {
        let row = index.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: SEQUENCE_HEADER,
                value: Some(sequence.as_bytes()),
            })
            .insert(Header {
                key: SNAPSHOT_HEADER,
                value: Some(snapshot.as_bytes()),
            })
            .insert(Header {
                key: TABLE_HEADER,
                value: Some(delivery.table_uuid.as_bytes()),
            })
            .insert(Header {
                key: ROW_HEADER,
                value: Some(row.as_bytes()),
            });
        let key = settings
            .key
            .as_deref()
            .and_then(|column| key_of(payload, column));
        let mut record = BaseRecord::<Vec<u8>, Vec<u8>>::to(&settings.topic)
            .payload(payload)
            .headers(headers);
        if let Some(key) = &key {
            record = record.key(key);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    producer.poll(Duration::from_millis(50));
                    record = back;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
    producer.commit_transaction(TXN_TIMEOUT)
}

impl Mirror for KafkaMirror {
    fn describe(&self) -> String {
        format!("kafka topic {}", self.settings.topic)
    }

    fn claim(&self) -> Mirroring<'_, Option<(String, i64)>> {
        Box::pin(async move {
            let config = self.config();
            ensure_topic(&config, &self.settings.topic, self.settings.partitions).await?;
            let slot = self.producer.clone();
            let topic = self.settings.topic.clone();
            let id = self.settings.transactional_id.clone();
            tokio::task::spawn_blocking(move || {
                let producer: BaseProducer = config
                    .clone()
                    .set("transactional.id", &id)
                    .set("enable.idempotence", "true")
                    .set("acks", "all")
                    .set("client.id", format!("floe-sink-{topic}"))
                    .create()
                    .map_err(|e| {
                        SourceError::user(format!("cannot create a sink producer: {e}"))
                    })?;
                // Aborts what an earlier producer of this id left open, and fences it.
                producer
                    .init_transactions(TXN_TIMEOUT)
                    .map_err(|e| external(&format!("cannot claim transactional id {id}"), e))?;
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(producer);
                read_tail(&config, &topic)
            })
            .await
            .map_err(|e| SourceError::internal(e.to_string()))?
        })
    }

    fn deliver(&self, delivery: Delivery) -> Mirroring<'_, ()> {
        Box::pin(async move {
            let slot = self.producer.clone();
            let settings = self.settings.clone();
            let rows = encode(&delivery)?;
            tokio::task::spawn_blocking(move || {
                let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                let Some(producer) = slot.as_ref() else {
                    return Err(SourceError::internal("the sink was not claimed"));
                };
                match send_transaction(producer, &settings, &delivery, &rows) {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        // Whatever is open is aborted; the next claim starts over from what the
                        // topic holds.
                        if let KafkaError::Transaction(t) = &e
                            && t.txn_requires_abort()
                        {
                            let _ = producer.abort_transaction(TXN_TIMEOUT);
                        }
                        *slot = None;
                        Err(external(
                            &format!("transaction to {} failed", settings.topic),
                            e,
                        ))
                    }
                }
            })
            .await
            .map_err(|e| SourceError::internal(e.to_string()))?
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn rows_become_json_objects_keyed_by_a_column() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("alert_id", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![Some("a1"), None])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let delivery = Delivery {
            sequence: 7,
            snapshot_id: 70,
            table_uuid: "u".into(),
            batches: vec![batch],
        };
        let rows = encode(&delivery).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            String::from_utf8_lossy(&rows[0]),
            r#"{"alert_id":"a1","n":1}"#
        );
        assert_eq!(key_of(&rows[0], "alert_id"), Some(b"a1".to_vec()));
        assert_eq!(key_of(&rows[1], "alert_id"), None);
        assert_eq!(key_of(&rows[1], "n"), Some(b"2".to_vec()));
    }
}
