//! What the benchmark harnesses share: release binaries, free ports, process CPU and memory
//! from `/proc`, and a release floe-catalog on a local warehouse.

#![allow(dead_code)] // each harness uses a part

use std::path::{Path, PathBuf};
use std::sync::Arc;

use floe_core::{Format, SourceRecord};
use floe_otlp::OtlpFormat;
use std::process::{Child, Command};
use std::time::Duration;

pub(crate) fn release_bin(name: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target")
            .display()
            .to_string()
    });
    PathBuf::from(target).join("release").join(name)
}

/// The release `floe run JOB` with `env` set, its log appended to `log`.
pub(crate) fn spawn_release_floe(job: &Path, log: &Path, env: &[(&str, &str)]) -> support::Floe {
    let floe = release_bin("floe");
    assert!(floe.exists(), "cargo build --release -p floe first");
    support::spawn_run(&floe, job, log, env, &[])
}

/// SIGTERM (a job's final checkpoint), then waits for the process.
pub(crate) fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// The tests' helpers (service variables, DuckDB read-back, Postgres sessions, free ports).
#[path = "../../tests/support/mod.rs"]
pub(crate) mod support;

pub(crate) use support::{committed, free_port};

/// A memory figure of `/proc/PID/status` (given in kB) in MiB; 0 once the process is gone.
pub(crate) fn status_mib(pid: u32, field: &str) -> f64 {
    support::proc_status(pid, field)
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The peak resident memory of a process so far (MiB).
pub(crate) fn peak_rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmHWM")
}

/// User + system CPU seconds of a process so far.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let fields: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks: f64 =
                fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0)
}

/// Total records of a table's current snapshot.
pub(crate) struct Catalog {
    pub(crate) process: Child,
    pub(crate) uri: String,
}

impl Drop for Catalog {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

pub(crate) fn start_catalog(dir: &Path) -> Catalog {
    let port = free_port();
    let process = Command::new(release_bin("floe-catalog"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--warehouse",
            &dir.join("warehouse").display().to_string(),
            "--store",
            &format!("sqlite://{}", dir.join("catalog.db").display()),
        ])
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("cargo build --release -p floe-catalog first");
    let uri = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Catalog { process, uri }
}

/// A client of a catalog started by [`start_catalog`].
pub(crate) async fn connect(catalog: &Catalog) -> floe_lake::rest::CatalogClient {
    floe_lake::rest::CatalogClient::connect(floe_lake::rest::CatalogSettings {
        uri: catalog.uri.clone(),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Decodes OTLP payloads as the job does (one record of `topic`, e.g. `otlp_spans`, each),
/// handing the format's batches to `sink` every 64k rows and at the end.
pub(crate) fn decode_otlp(
    topic: &str,
    payloads: &[Vec<u8>],
    mut sink: impl FnMut(Vec<(usize, arrow_array::RecordBatch)>),
) {
    let mut format = OtlpFormat::new(Default::default());
    let topic: Arc<str> = Arc::from(topic);
    for (offset, payload) in payloads.iter().enumerate() {
        let record = SourceRecord {
            topic: topic.clone(),
            partition: 0,
            offset: offset as i64,
            payload: payload.clone(),
            key: None,
        };
        format.append(&record, 0).unwrap();
        if format.buffered_rows() >= 64 * 1024 {
            sink(format.take());
        }
    }
    sink(format.take());
}

/// The Parquet settings `floe run` writes the spans table with: zstd 1, a bloom filter on
/// `trace_id`, no dictionary for floe-otlp's plain columns.
pub(crate) fn spans_parquet_properties() -> parquet::file::properties::WriterProperties {
    use parquet::schema::types::ColumnPath;
    let level = parquet::basic::ZstdLevel::try_new(1).unwrap();
    let mut props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(level))
        .set_column_bloom_filter_enabled(ColumnPath::from("trace_id"), true);
    for column in floe_otlp::OtlpTable::Spans.plain_columns() {
        props = props.set_column_dictionary_enabled(ColumnPath::from(*column), false);
    }
    props.build()
}

/// Creates `topic` with `partitions` and produces `records` OTLP traces records of
/// `spans_per_record` spans each (the deterministic generator, seed 3), record `i` to
/// partition `i % partitions`. Returns the payloads as produced.
pub(crate) async fn produce_spans(
    brokers: &str,
    topic: &str,
    partitions: i32,
    records: usize,
    spans_per_record: usize,
) -> Vec<Vec<u8>> {
    let mut generator = floe_otlp::generate::Generator::new(3, 1_700_000_000_000_000_000);
    let payloads: Vec<Vec<u8>> = (0..records)
        .map(|_| {
            let [traces, _] = generator.requests(spans_per_record / 5);
            traces.bytes
        })
        .collect();
    produce(brokers, topic, partitions, &payloads).await;
    payloads
}

/// Creates `topic` with `partitions` and produces `payloads`, record `i` to partition
/// `i % partitions`.
pub(crate) async fn produce(brokers: &str, topic: &str, partitions: i32, payloads: &[Vec<u8>]) {
    use rdkafka::ClientConfig;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    for r in admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        r.unwrap();
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("message.max.bytes", "10000000")
        .create()
        .unwrap();
    let mut sends = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        sends.push(
            producer.send(
                FutureRecord::<(), [u8]>::to(topic)
                    .partition(i as i32 % partitions)
                    .payload(p),
                Duration::from_secs(30),
            ),
        );
        if sends.len() >= 256 {
            for s in sends.drain(..) {
                s.await.map_err(|(e, _)| e).unwrap();
            }
        }
    }
    for s in sends {
        s.await.map_err(|(e, _)| e).unwrap();
    }
}

/// Waits until job `job` in `namespace` committed `ends[p]` for every partition `p` of
/// `topic`.
pub(crate) async fn wait_committed(
    client: &floe_lake::rest::CatalogClient,
    namespace: &str,
    job: &str,
    topic: &str,
    ends: &[i64],
) {
    loop {
        let positions = committed(client, namespace, job).await;
        if ends.iter().enumerate().all(|(p, end)| {
            floe_core::position_of(&positions, topic, p as i32).unwrap_or(0) >= *end
        }) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A job file `dir/{name}.toml` reading OTLP traces from `topic` into `namespace` of the
/// catalog at `uri`, 10 s checkpoints, a new consumer group, then `extra` (operators, tables).
pub(crate) fn spans_job_file(
    dir: &Path,
    name: &str,
    namespace: &str,
    (brokers, topic): (&str, &str),
    uri: &str,
    extra: &str,
) -> PathBuf {
    otlp_job_file(dir, name, namespace, (brokers, topic, "traces"), uri, extra)
}

/// [`spans_job_file`] for a topic of any OTLP signal.
pub(crate) fn otlp_job_file(
    dir: &Path,
    name: &str,
    namespace: &str,
    (brokers, topic, signal): (&str, &str, &str),
    uri: &str,
    extra: &str,
) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"version = 1
name = "{name}"
[source.kafka]
brokers = "{brokers}"
topics = ["{topic}"]
group_id = "{name}-{group}"
signals = {{ "{topic}" = "{signal}" }}
[catalog]
uri = "{uri}"
namespace = "{namespace}"
[checkpoint]
interval = "10s"
state_dir = "{state}"
{extra}"#,
            group = uuid::Uuid::new_v4(),
            state = dir.join(name).display()
        ),
    )
    .unwrap();
    path
}
