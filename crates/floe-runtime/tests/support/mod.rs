//! What floe-runtime's tests share: an in-memory partitioned broker and its [`Source`] (with
//! consumer-group assignments that can change, noticed or not), a format of one stream of
//! `(partition, offset, value)` rows, an in-process catalog, and reading a table back.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::builder::{Int32Builder, Int64Builder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{ArrayRef, RecordBatch};
use floe_core::{
    Appended, Format, PollLimit, Polled, Positions, Refused, Source, SourceError, SourceRecord,
    StreamSpec, position_key, position_of,
};
use floe_lake::rest::{CatalogClient, CatalogSettings, LoadedTable};
use futures::TryStreamExt;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

/// The records of one topic's partitions, and which group member owns each partition.
#[derive(Debug)]
pub struct Broker {
    topic: Arc<str>,
    partitions: Vec<Vec<Vec<u8>>>,
    owners: Vec<Option<usize>>,
    generation: u64,
}

/// A shared broker.
pub type Shared = Arc<Mutex<Broker>>;

impl Broker {
    /// `partitions` empty partitions of `topic`, owned by nobody.
    pub fn new(topic: &str, partitions: usize) -> Shared {
        Arc::new(Mutex::new(Self {
            topic: Arc::from(topic),
            partitions: vec![Vec::new(); partitions],
            owners: vec![None; partitions],
            generation: 0,
        }))
    }
}

/// Appends a record to a partition.
pub fn produce(broker: &Shared, partition: usize, payload: Vec<u8>) {
    broker.lock().unwrap().partitions[partition].push(payload);
}

/// Records in every partition.
pub fn produced(broker: &Shared) -> Vec<usize> {
    broker
        .lock()
        .unwrap()
        .partitions
        .iter()
        .map(Vec::len)
        .collect()
}

/// Gives each partition to a member (`None`: nobody); members that notice rebalances see a
/// new generation.
pub fn assign(broker: &Shared, owners: &[Option<usize>]) {
    let mut b = broker.lock().unwrap();
    b.owners = owners.to_vec();
    b.generation += 1;
}

/// One member's consumer of a [`Broker`].
#[derive(Debug)]
pub struct MemorySource {
    broker: Shared,
    member: usize,
    /// Whether it notices assignment changes (a zombie does not, and keeps reading what it
    /// owned).
    notices: bool,
    seen: u64,
    assigned: Vec<i32>,
    next: HashMap<i32, i64>,
}

impl MemorySource {
    pub fn new(broker: &Shared, member: usize, notices: bool) -> Self {
        let (seen, assigned) = {
            let b = broker.lock().unwrap();
            (b.generation, owned(&b, member))
        };
        Self {
            broker: broker.clone(),
            member,
            notices,
            seen,
            assigned,
            next: HashMap::new(),
        }
    }
}

fn owned(b: &Broker, member: usize) -> Vec<i32> {
    b.owners
        .iter()
        .enumerate()
        .filter(|(_, o)| **o == Some(member))
        .map(|(p, _)| p as i32)
        .collect()
}

impl Source for MemorySource {
    async fn poll(
        &mut self,
        out: &mut Vec<SourceRecord>,
        limit: PollLimit,
        timeout: Duration,
    ) -> Result<Polled, SourceError> {
        {
            let b = self.broker.lock().unwrap();
            if self.notices && b.generation != self.seen {
                self.seen = b.generation;
                self.assigned = owned(&b, self.member);
                return Ok(Polled::Rebalanced);
            }
            let mut bytes = 0;
            for &p in &self.assigned {
                let next = self.next.entry(p).or_insert(0);
                let records = &b.partitions[p as usize];
                while (*next as usize) < records.len()
                    && out.len() < limit.records
                    && bytes < limit.bytes
                {
                    let payload = records[*next as usize].clone();
                    bytes += payload.len();
                    out.push(SourceRecord {
                        topic: b.topic.clone(),
                        partition: p,
                        offset: *next,
                        payload,
                        key: None,
                    });
                    *next += 1;
                }
            }
        }
        if out.is_empty() {
            tokio::time::sleep(timeout.min(Duration::from_millis(10))).await;
        }
        Ok(Polled::Records)
    }

    fn assignment(&self) -> Vec<String> {
        let topic = self.broker.lock().unwrap().topic.clone();
        self.assigned
            .iter()
            .map(|p| position_key(&topic, *p))
            .collect()
    }

    fn seek(&mut self, positions: &Positions) -> Result<(), SourceError> {
        let topic = self.broker.lock().unwrap().topic.clone();
        self.next = self
            .assigned
            .iter()
            .map(|p| (*p, position_of(positions, &topic, *p).unwrap_or(0)))
            .collect();
        Ok(())
    }

    fn acknowledge(&mut self, _positions: &Positions) {}
}

/// Records as rows of one stream `events`: `(partition, offset, value)`, the value being the
/// payload as a decimal number (anything else is refused).
#[derive(Debug, Default)]
pub struct ValueFormat {
    partition: Int32Builder,
    offset: Int64Builder,
    value: Int64Builder,
    rows: usize,
}

pub fn events_schema() -> Schema {
    let p = |t| Type::Primitive(t);
    Schema::builder()
        .with_fields(vec![
            Arc::new(NestedField::required(1, "partition", p(PrimitiveType::Int))),
            Arc::new(NestedField::required(2, "offset", p(PrimitiveType::Long))),
            Arc::new(NestedField::required(3, "value", p(PrimitiveType::Long))),
        ])
        .build()
        .unwrap()
}

impl Format for ValueFormat {
    fn streams(&self) -> Vec<StreamSpec> {
        vec![StreamSpec::append("events", "events", events_schema())]
    }

    fn append(&mut self, record: &SourceRecord, _ingested_at_us: i64) -> Result<Appended, Refused> {
        let value: i64 = std::str::from_utf8(&record.payload)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Refused::Record("not a number".into()))?;
        self.partition.append_value(record.partition);
        self.offset.append_value(record.offset);
        self.value.append_value(value);
        self.rows += 1;
        Ok(Appended::Rows)
    }

    fn buffered_rows(&self) -> usize {
        self.rows
    }

    fn stream_rows(&self, stream: usize) -> usize {
        if stream == 0 { self.rows } else { 0 }
    }

    fn take(&mut self) -> Vec<(usize, RecordBatch)> {
        if self.rows == 0 {
            return Vec::new();
        }
        self.rows = 0;
        let columns: [(&str, ArrayRef); 3] = [
            ("partition", Arc::new(self.partition.finish())),
            ("offset", Arc::new(self.offset.finish())),
            ("value", Arc::new(self.value.finish())),
        ];
        vec![(0, RecordBatch::try_from_iter(columns).unwrap())]
    }
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("floe-runtime-{tag}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A floe-catalog in this process on SQLite and a local warehouse under `dir`, and a client.
pub async fn start_catalog(dir: &Path) -> (floe_catalog::RunningCatalog, CatalogClient) {
    let catalog = floe_catalog::start(
        &floe_catalog::config::CatalogConfig::load(
            None,
            &floe_catalog::config::Overrides {
                listen: Some("127.0.0.1:0".into()),
                warehouse: Some(dir.join("warehouse").display().to_string()),
                store: Some(format!("sqlite://{}", dir.join("catalog.db").display())),
                ..Default::default()
            },
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let client = CatalogClient::connect(CatalogSettings {
        uri: catalog.uri(),
        ..Default::default()
    })
    .await
    .unwrap();
    (catalog, client)
}

/// `[source.memory]`: the in-memory broker's section of a test job file (the test builds the
/// reader itself).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySection {
    memory: toml::Table,
}

impl floe_runtime::job::SourceSection for MemorySection {
    type Config = ();

    fn check(&self, _c: &mut floe_config::Checker<'_>, _job: &str) -> Option<()> {
        let _ = &self.memory;
        Some(())
    }

    fn streams(_config: &()) -> floe_runtime::job::Streams {
        floe_runtime::job::Streams::Known(ValueFormat::default().streams())
    }
}

/// A job file for the in-memory source with `extra` appended.
pub fn job_config(name: &str, uri: &str, extra: &str) -> floe_runtime::JobConfig {
    let text = format!(
        "version = 1\nname = \"{name}\"\n[source.memory]\n[catalog]\nuri = \"{uri}\"\nnamespace = \"t\"\n\
         [checkpoint]\ninterval = \"100ms\"\n{extra}"
    );
    match floe_runtime::JobConfig::from_toml::<MemorySection>(None, &text) {
        Ok((config, ())) => config,
        Err(e) => panic!("{e}"),
    }
}

/// The live rows of a table (deletes applied), all columns, by Floe's reader (iceberg-rust
/// 0.10.1's scan can hang on delete files; see floe-lake's test support).
pub async fn scan(table: &LoadedTable) -> Vec<RecordBatch> {
    floe_lake::read::read_live(table, floe_lake::read::ReadRequest::current())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// `(partition, offset, value)` of every row of an `events` table, sorted.
pub async fn events(table: &LoadedTable) -> Vec<(i32, i64, i64)> {
    let mut rows = Vec::new();
    for b in scan(table).await {
        let p = b
            .column_by_name("partition")
            .unwrap()
            .as_primitive::<Int32Type>();
        let o = b
            .column_by_name("offset")
            .unwrap()
            .as_primitive::<Int64Type>();
        let v = b
            .column_by_name("value")
            .unwrap()
            .as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            rows.push((p.value(i), o.value(i), v.value(i)));
        }
    }
    rows.sort();
    rows
}

/// Records `key,event_ms` as rows of one stream `events`: `k` (string), `ts` (timestamptz,
/// from the milliseconds), and the record's `partition` and `offset`; anything else is
/// refused.
#[derive(Debug, Default)]
pub struct EventFormat {
    key: arrow_array::builder::StringBuilder,
    ts: arrow_array::builder::TimestampMicrosecondBuilder,
    partition: Int32Builder,
    offset: Int64Builder,
    rows: usize,
}

pub fn event_schema() -> Schema {
    let p = |t| Type::Primitive(t);
    Schema::builder()
        .with_fields(vec![
            Arc::new(NestedField::optional(1, "k", p(PrimitiveType::String))),
            Arc::new(NestedField::optional(
                2,
                "ts",
                p(PrimitiveType::Timestamptz),
            )),
            Arc::new(NestedField::required(3, "partition", p(PrimitiveType::Int))),
            Arc::new(NestedField::required(4, "offset", p(PrimitiveType::Long))),
        ])
        .build()
        .unwrap()
}

/// The stream `events` of [`EventFormat`].
pub fn event_stream() -> StreamSpec {
    StreamSpec {
        time_column: Some("ts".into()),
        ..StreamSpec::append("events", "events", event_schema())
    }
}

impl Format for EventFormat {
    fn streams(&self) -> Vec<StreamSpec> {
        vec![event_stream()]
    }

    fn append(&mut self, record: &SourceRecord, _ingested_at_us: i64) -> Result<Appended, Refused> {
        let text =
            std::str::from_utf8(&record.payload).map_err(|_| Refused::Record("not text".into()))?;
        let (key, ms) = text
            .split_once(',')
            .ok_or_else(|| Refused::Record("not key,ms".into()))?;
        let ms: Option<i64> = if ms.is_empty() {
            None
        } else {
            Some(
                ms.parse()
                    .map_err(|_| Refused::Record("not key,ms".into()))?,
            )
        };
        self.key.append_option((!key.is_empty()).then_some(key));
        self.ts.append_option(ms.map(|m| m * 1000));
        self.partition.append_value(record.partition);
        self.offset.append_value(record.offset);
        self.rows += 1;
        Ok(Appended::Rows)
    }

    fn buffered_rows(&self) -> usize {
        self.rows
    }

    fn stream_rows(&self, stream: usize) -> usize {
        if stream == 0 { self.rows } else { 0 }
    }

    fn take(&mut self) -> Vec<(usize, RecordBatch)> {
        if self.rows == 0 {
            return Vec::new();
        }
        self.rows = 0;
        let columns: [(&str, ArrayRef); 4] = [
            ("k", Arc::new(self.key.finish())),
            ("ts", Arc::new(self.ts.finish().with_timezone("+00:00"))),
            ("partition", Arc::new(self.partition.finish())),
            ("offset", Arc::new(self.offset.finish())),
        ];
        vec![(0, RecordBatch::try_from_iter(columns).unwrap())]
    }
}

/// `[source.memory]` for the event stream.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSection {
    memory: toml::Table,
}

impl floe_runtime::job::SourceSection for EventSection {
    type Config = ();

    fn check(&self, _c: &mut floe_config::Checker<'_>, _job: &str) -> Option<()> {
        let _ = &self.memory;
        Some(())
    }

    fn streams(_config: &()) -> floe_runtime::job::Streams {
        floe_runtime::job::Streams::Known(vec![event_stream()])
    }
}

/// A job file of the event stream with `extra` (operators, streams) appended.
pub fn event_job(name: &str, uri: &str, state_dir: &Path, extra: &str) -> floe_runtime::JobConfig {
    let text = format!(
        "version = 1\nname = \"{name}\"\n[source.memory]\n[catalog]\nuri = \"{uri}\"\nnamespace = \"t\"\n\
         [checkpoint]\ninterval = \"100ms\"\nstate_dir = \"{}\"\n{extra}",
        state_dir.display()
    );
    match floe_runtime::JobConfig::from_toml::<EventSection>(None, &text) {
        Ok((config, ())) => config,
        Err(e) => panic!("{e}"),
    }
}
