//! Kafka as a job's exchange: the topic an `exchange` operator re-keys rows through, created
//! with the partition count and retention the job file gives, and the producer that writes it
//! under the contract of [`floe_core::exchange`].
//!
//! * **The topic** is created on first start (`partitions`, `retention.ms`, `cleanup.policy =
//!   delete`). An existing topic with another partition count is refused: keys would move to
//!   other partitions than the state committed for them.
//! * **The producer** is idempotent with librdkafka's gapless guarantee (`enable.idempotence`,
//!   `enable.gapless.guarantee`): per partition, records land in the order sent, each once, and
//!   a failure that would leave a gap stops the producer instead. `acks = all`; lz4 batches.

use std::sync::Mutex;
use std::time::Duration;

use floe_core::exchange::{Flushing, Sending};
use floe_core::{ExchangeProducer, SourceError};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use crate::KafkaSettings;

/// What an exchange topic must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// Its name.
    pub name: String,
    /// Its partition count (the most replicas that share the reading side).
    pub partitions: i32,
    /// How long records stay (`retention.ms`; -1 keeps them).
    pub retention_ms: i64,
    /// Copies of each partition (-1: the broker's default).
    pub replication: i32,
}

fn client_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &settings.brokers);
    for (key, value) in &settings.properties {
        config.set(key, value);
    }
    config
}

/// Creates the topic unless it exists; an existing topic must have `spec.partitions`.
pub async fn ensure_topic(settings: &KafkaSettings, spec: &TopicSpec) -> Result<(), SourceError> {
    let admin: AdminClient<DefaultClientContext> = client_config(settings)
        .create()
        .map_err(|e| SourceError::user(format!("cannot create a Kafka admin client: {e}")))?;
    let retention = spec.retention_ms.to_string();
    let topic = NewTopic::new(
        &spec.name,
        spec.partitions,
        TopicReplication::Fixed(spec.replication),
    )
    .set("retention.ms", &retention)
    .set("cleanup.policy", "delete");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics([&topic], &options)
        .await
        .map_err(|e| SourceError::external(format!("cannot create topic {}: {e}", spec.name)))?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(
                topic = %spec.name,
                partitions = spec.partitions,
                retention_ms = spec.retention_ms,
                "exchange topic created"
            ),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(SourceError::external(format!(
                    "cannot create topic {name}: {code}"
                )));
            }
        }
    }
    // The topic as the brokers have it now (a topic just created may take a moment to show
    // in the metadata).
    let began = std::time::Instant::now();
    let found = loop {
        let found = topic_partitions(settings, &spec.name).await?;
        if found > 0 || began.elapsed() > Duration::from_secs(15) {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if found != spec.partitions {
        return Err(SourceError::user(format!(
            "exchange topic {} has {found} partitions, the job file says {}: a partition count \
             cannot change under committed state (keys would move); give the exchange a new \
             `topic` to start over",
            spec.name, spec.partitions
        )));
    }
    Ok(())
}

/// How many partitions `topic` has now (0: none, or no such topic).
pub async fn topic_partitions(settings: &KafkaSettings, topic: &str) -> Result<i32, SourceError> {
    let admin: AdminClient<DefaultClientContext> = client_config(settings)
        .create()
        .map_err(|e| SourceError::user(format!("cannot create a Kafka admin client: {e}")))?;
    partitions_of(admin, topic).await
}

async fn partitions_of(
    admin: AdminClient<DefaultClientContext>,
    topic: &str,
) -> Result<i32, SourceError> {
    let name = topic.to_string();
    let metadata = tokio::task::spawn_blocking(move || {
        admin
            .inner()
            .fetch_metadata(Some(&name), Duration::from_secs(10))
    })
    .await
    .map_err(|e| SourceError::internal(e.to_string()))?
    .map_err(|e| SourceError::external(format!("cannot read topic {topic}: {e}")))?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len() as i32))
}

/// The Kafka producer of a job's exchanges.
pub struct KafkaExchange {
    producer: FutureProducer,
    /// Records sent and not yet known to have landed.
    pending: Mutex<Vec<DeliveryFuture>>,
}

impl std::fmt::Debug for KafkaExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaExchange").finish_non_exhaustive()
    }
}

impl KafkaExchange {
    /// A producer on the job's brokers (and its librdkafka properties).
    pub fn connect(settings: &KafkaSettings) -> Result<Self, SourceError> {
        let mut config = client_config(settings);
        config
            .set("enable.idempotence", "true")
            .set("enable.gapless.guarantee", "true")
            .set("acks", "all")
            .set("compression.type", "lz4")
            .set("linger.ms", "5")
            .set("client.id", "floe-exchange");
        let producer: FutureProducer = config
            .create()
            .map_err(|e| SourceError::user(format!("cannot create the exchange producer: {e}")))?;
        Ok(Self {
            producer,
            pending: Mutex::new(Vec::new()),
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<DeliveryFuture>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ExchangeProducer for KafkaExchange {
    fn send<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        key: &'a [u8],
        payload: &'a [u8],
    ) -> Sending<'a> {
        Box::pin(async move {
            loop {
                let record = FutureRecord::to(topic)
                    .partition(partition)
                    .key(key)
                    .payload(payload);
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        self.pending().push(delivery);
                        return Ok(());
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    Err((e, _)) => {
                        return Err(SourceError::external(format!(
                            "cannot send to exchange topic {topic}: {e}"
                        )));
                    }
                }
            }
        })
    }

    fn flush(&self) -> Flushing<'_> {
        Box::pin(async move {
            let pending = std::mem::take(&mut *self.pending());
            let count = pending.len() as u64;
            for delivery in pending {
                match delivery.await {
                    Ok(Ok(_)) => {}
                    Ok(Err((e, message))) => {
                        use rdkafka::Message;
                        return Err(SourceError::external(format!(
                            "a record of exchange topic {} partition {} did not land: {e}",
                            message.topic(),
                            message.partition()
                        )));
                    }
                    Err(_) => {
                        return Err(SourceError::internal(
                            "the exchange producer stopped before a record landed",
                        ));
                    }
                }
            }
            Ok(count)
        })
    }

    fn forget(&self) {
        self.pending().clear();
    }
}
