//! Job files: parsed, interpolated and validated; every problem reported at `file:line:col`.
//!
//! ```toml
//! version = 1
//! name = "otlp"                      # the job id in every commit marker
//!
//! [source.kafka]                     # or [source.generator] (the quickstart's)
//! brokers = "${KAFKA_BROKERS:-localhost:9092}"
//! topics = ["otlp_spans", "otlp_logs", "otlp_metrics"]
//! group_id = "floe-otlp"
//! start = "earliest"                 # where a partition without a committed position starts
//! format = "otlp"
//! signals = { my_spans = "traces" }  # topics not named like the Collector's defaults
//! properties = { "security.protocol" = "SASL_SSL" }  # passed to librdkafka
//!
//! [catalog]
//! uri = "http://127.0.0.1:8181"      # or [catalog.embedded] warehouse = "…"
//! namespace = "otel"
//!
//! [checkpoint]
//! interval = "10s"
//! max_buffered_bytes = "256MiB"
//! state_dir = ".floe/otlp"
//!
//! [tables.spans]
//! name = "otel_spans"
//! partition = ["day(ts)"]
//! target_file_size = "128MiB"
//!
//! [dead_letter]
//! table = "floe_dead_letters"
//! ```
//!
//! Every string value may use `${VAR}` and `${VAR:-default}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floe_config::{ConfigErrors, ConfigProblem, Source};
use floe_core::{StartAt, StreamSpec};
pub use floe_lake::tables::PartitionField;
use serde::Deserialize;
use toml::Spanned;

type S = Spanned<String>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    version: Option<Spanned<i64>>,
    name: Option<S>,
    source: Option<Spanned<RawSource>>,
    catalog: Option<Spanned<RawCatalog>>,
    #[serde(default)]
    checkpoint: RawCheckpoint,
    #[serde(default)]
    tables: BTreeMap<S, RawTable>,
    #[serde(default)]
    dead_letter: RawDeadLetter,
    #[serde(default)]
    metrics: RawMetrics,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    kafka: Option<RawKafka>,
    generator: Option<RawGenerator>,
    postgres: Option<RawPostgres>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPostgres {
    host: Option<S>,
    port: Option<Spanned<RawPort>>,
    user: Option<S>,
    password: Option<S>,
    database: Option<S>,
    ssl_mode: Option<S>,
    ssl_root_cert: Option<S>,
    publication: Option<S>,
    slot: Option<S>,
    tables: Option<Vec<S>>,
    snapshot_parallelism: Option<Spanned<i64>>,
    replica_identity_full: Option<bool>,
    warn_retained_wal: Option<S>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKafka {
    brokers: Option<S>,
    topics: Option<Vec<S>>,
    group_id: Option<S>,
    start: Option<S>,
    format: Option<S>,
    #[serde(default)]
    signals: BTreeMap<String, S>,
    #[serde(default)]
    properties: BTreeMap<String, S>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGenerator {
    requests_per_second: Option<Spanned<i64>>,
    duration: Option<S>,
    seed: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    uri: Option<S>,
    warehouse: Option<S>,
    token: Option<S>,
    credential: Option<S>,
    namespace: Option<S>,
    embedded: Option<RawEmbedded>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEmbedded {
    warehouse: S,
    listen: Option<S>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheckpoint {
    interval: Option<S>,
    max_buffered_bytes: Option<S>,
    state_dir: Option<S>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    name: Option<S>,
    partition: Option<Vec<S>>,
    target_file_size: Option<S>,
    #[serde(default)]
    properties: BTreeMap<String, S>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeadLetter {
    table: Option<S>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<S>,
}

/// `[source.kafka]`.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Topics.
    pub topics: Vec<String>,
    /// Consumer group.
    pub group_id: String,
    /// Start policy.
    pub start: StartAt,
    /// Topic → signal name, for topics not named like the Collector's defaults.
    pub signals: BTreeMap<String, String>,
    /// librdkafka properties.
    pub properties: BTreeMap<String, String>,
    /// What the records hold.
    pub format: KafkaFormat,
}

/// The `format` of Kafka records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaFormat {
    /// OpenTelemetry (protobuf or JSON), appended to the OTLP tables.
    Otlp,
    /// Debezium change events (JSON, with or without the schema envelope), kept as upserts.
    DebeziumJson,
}

/// `[source.generator]`: built-in OTLP data.
#[derive(Debug, Clone)]
pub struct GeneratorConfig {
    /// Requests (traces of five spans, five logs) per second.
    pub requests_per_second: u64,
    /// Stop after this long (`None`: until stopped).
    pub duration: Option<Duration>,
    /// Seed of the data.
    pub seed: u64,
}

/// A port: a number, or a string (which may use `${VAR}`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawPort {
    Number(i64),
    Text(String),
}

/// `[source.postgres]`: a publication followed through a logical replication slot.
#[derive(Debug, Clone)]
pub struct PostgresSourceConfig {
    /// Host name or Unix socket directory.
    pub host: String,
    /// Port.
    pub port: u16,
    /// User (with the REPLICATION attribute).
    pub user: String,
    /// Password.
    pub password: String,
    /// Database.
    pub database: String,
    /// `disable`, `require`, `verify-ca` or `verify-full`.
    pub ssl_mode: String,
    /// CA file for `verify-ca` / `verify-full`.
    pub ssl_root_cert: Option<PathBuf>,
    /// Publication (created if missing).
    pub publication: String,
    /// Replication slot (created if missing).
    pub slot: String,
    /// Tables of a publication to create (`schema.table`); empty: all tables.
    pub tables: Vec<String>,
    /// Sessions copying tables in parallel during the initial snapshot.
    pub snapshot_parallelism: usize,
    /// Let Floe set `REPLICA IDENTITY FULL` where unchanged TOASTed values need it.
    pub replica_identity_full: bool,
    /// Warn when the slot retains more WAL than this many bytes.
    pub warn_retained_wal: u64,
}

/// The source of a job.
#[derive(Debug, Clone)]
pub enum SourceConfig {
    /// Kafka topics.
    Kafka(KafkaSourceConfig),
    /// Postgres logical replication.
    Postgres(PostgresSourceConfig),
    /// The built-in generator.
    Generator(GeneratorConfig),
}

/// `[catalog.embedded]`: a floe-catalog started inside the job process.
#[derive(Debug, Clone)]
pub struct EmbeddedCatalog {
    /// Warehouse root (`file://…`, an absolute or relative path, or `s3://…`).
    pub warehouse: String,
    /// Listen address (`127.0.0.1:0` picks a free port).
    pub listen: String,
}

/// `[catalog]`.
#[derive(Debug, Clone)]
pub struct CatalogConfig {
    /// REST URI (unset when embedded).
    pub uri: Option<String>,
    /// Warehouse name sent to the catalog.
    pub warehouse: Option<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// OAuth2 `id:secret`.
    pub credential: Option<String>,
    /// Namespace of the job's tables.
    pub namespace: String,
    /// Start a catalog in-process.
    pub embedded: Option<EmbeddedCatalog>,
}

/// Settings of one stream's table (`[tables.<stream>]`).
#[derive(Debug, Clone)]
pub struct TableConfig {
    /// The stream.
    pub key: String,
    /// Table name (default: the stream's).
    pub name: Option<String>,
    /// Partition spec of a new table (default: the stream's).
    pub partition: Option<Vec<PartitionField>>,
    /// Roll files past this size.
    pub target_file_size: u64,
    /// Table properties of a new table.
    pub properties: BTreeMap<String, String>,
}

/// A validated job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Job name (the id in commit markers).
    pub name: String,
    /// Source.
    pub source: SourceConfig,
    /// Catalog.
    pub catalog: CatalogConfig,
    /// Checkpoint interval.
    pub interval: Duration,
    /// Checkpoint early once this many payload bytes are buffered.
    pub max_buffered_bytes: u64,
    /// Local state directory.
    pub state_dir: PathBuf,
    /// Per-table settings, in the format's order.
    pub tables: Vec<TableConfig>,
    /// Dead-letter table name.
    pub dead_letter_table: String,
    /// Where `/metrics` listens (`None`: off).
    pub metrics_listen: Option<String>,
}

struct Check<'a> {
    source: Source<'a>,
    problems: Vec<ConfigProblem>,
}

impl Check<'_> {
    fn at(&mut self, value: &S, message: impl Into<String>) {
        self.problems
            .push(self.source.problem(Some(value.span()), message));
    }

    /// Interpolated text of a value.
    fn text(&mut self, value: &S) -> String {
        match floe_config::interpolate(value.get_ref()) {
            Ok(text) => text,
            Err(message) => {
                self.at(value, message);
                String::new()
            }
        }
    }

    fn opt(&mut self, value: Option<&S>) -> Option<String> {
        value.map(|v| self.text(v))
    }

    fn duration(&mut self, value: Option<&S>, default: Duration) -> Duration {
        self.positive(
            value,
            default,
            floe_config::parse_duration,
            Duration::is_zero,
        )
    }

    fn bytes(&mut self, value: Option<&S>, default: u64) -> u64 {
        self.positive(value, default, floe_config::parse_bytes, |b| *b == 0)
    }

    /// A value parsed by `parse` that must not be zero; `default` when absent or wrong.
    fn positive<T>(
        &mut self,
        value: Option<&S>,
        default: T,
        parse: fn(&str) -> Result<T, String>,
        is_zero: fn(&T) -> bool,
    ) -> T {
        let Some(value) = value else {
            return default;
        };
        let text = self.text(value);
        match parse(&text) {
            Ok(parsed) if !is_zero(&parsed) => parsed,
            Ok(_) => {
                self.at(value, "must be more than zero");
                default
            }
            Err(message) => {
                self.at(value, message);
                default
            }
        }
    }
}

impl JobConfig {
    /// Reads and validates a job file against the streams its format declares.
    pub fn load(path: &Path, tables: &[StreamSpec]) -> Result<Self, ConfigErrors> {
        let text = floe_config::read(path)?;
        Self::from_toml(Some(path), &text, tables)
    }

    /// Validates job TOML; `tables` are the format's streams.
    pub fn from_toml(
        file: Option<&Path>,
        text: &str,
        tables: &[StreamSpec],
    ) -> Result<Self, ConfigErrors> {
        let source = Source { file, text };
        let raw: RawJob = floe_config::parse(source)?;
        let mut c = Check {
            source,
            problems: Vec::new(),
        };
        floe_config::check_version(source, raw.version.as_ref(), &mut c.problems);

        let name = match &raw.name {
            Some(n) => {
                let name = c.text(n);
                if name.is_empty()
                    || !name
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
                {
                    c.at(n, "a job name is letters, digits, '-', '_' or '.'");
                }
                name
            }
            None => {
                c.problems.push(source.problem(None, "`name` is required"));
                String::new()
            }
        };

        let job_source = match &raw.source {
            None => {
                c.problems.push(source.problem(
                    None,
                    "a [source.kafka], [source.postgres] or [source.generator] section is required",
                ));
                None
            }
            Some(spanned) => {
                let r = spanned.get_ref();
                match (&r.kafka, &r.generator, &r.postgres) {
                    (Some(k), None, None) => Some(SourceConfig::Kafka(kafka(&mut c, k, &name))),
                    (None, Some(g), None) => Some(SourceConfig::Generator(generator(&mut c, g))),
                    (None, None, Some(p)) => {
                        Some(SourceConfig::Postgres(postgres(&mut c, p, &name)))
                    }
                    _ => {
                        c.problems.push(source.problem(
                            Some(spanned.span()),
                            "give exactly one of [source.kafka], [source.postgres] and \
                             [source.generator]",
                        ));
                        None
                    }
                }
            }
        };
        let change_source = match &job_source {
            Some(SourceConfig::Postgres(_)) => true,
            Some(SourceConfig::Kafka(k)) => k.format == KafkaFormat::DebeziumJson,
            _ => false,
        };

        let catalog = match &raw.catalog {
            None => {
                c.problems
                    .push(source.problem(None, "a [catalog] section is required"));
                None
            }
            Some(spanned) => {
                let r = spanned.get_ref();
                let embedded = r.embedded.as_ref().map(|e| EmbeddedCatalog {
                    warehouse: c.text(&e.warehouse),
                    listen: c
                        .opt(e.listen.as_ref())
                        .unwrap_or_else(|| "127.0.0.1:0".into()),
                });
                let uri = c.opt(r.uri.as_ref());
                match (&uri, &embedded) {
                    (None, None) => c.problems.push(source.problem(
                        Some(spanned.span()),
                        "give the catalog's `uri`, or [catalog.embedded] to run one in-process",
                    )),
                    (Some(_), Some(_)) => c.problems.push(source.problem(
                        Some(spanned.span()),
                        "`uri` and [catalog.embedded] exclude each other",
                    )),
                    _ => {}
                }
                if let (Some(u), Some(raw_uri)) = (&uri, &r.uri)
                    && !(u.starts_with("http://") || u.starts_with("https://"))
                {
                    c.at(
                        raw_uri,
                        "the catalog uri must start with http:// or https://",
                    );
                }
                Some(CatalogConfig {
                    uri,
                    warehouse: c.opt(r.warehouse.as_ref()),
                    token: c.opt(r.token.as_ref()),
                    credential: c.opt(r.credential.as_ref()),
                    namespace: c
                        .opt(r.namespace.as_ref())
                        .unwrap_or_else(|| "default".into()),
                    embedded,
                })
            }
        };

        let interval = c.duration(raw.checkpoint.interval.as_ref(), Duration::from_secs(10));
        let max_buffered_bytes = c.bytes(
            raw.checkpoint.max_buffered_bytes.as_ref(),
            256 * 1024 * 1024,
        );
        let state_dir = c
            .opt(raw.checkpoint.state_dir.as_ref())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!(".floe/{name}")));

        for key in raw.tables.keys() {
            if change_source {
                if !key.get_ref().contains('.') {
                    c.at(
                        key,
                        "a CDC table is named `schema.table`, e.g. [tables.\"public.orders\"]",
                    );
                }
            } else if !tables.iter().any(|t| &t.name == key.get_ref()) {
                let known: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
                c.at(
                    key,
                    format!(
                        "no table {:?} in this format; its tables are {known:?}",
                        key.get_ref()
                    ),
                );
            }
        }
        let mut table_configs = Vec::new();
        if change_source {
            // The source's tables are known once it connects; these settings apply by name.
            for (key, t) in &raw.tables {
                let partition = t
                    .partition
                    .iter()
                    .flatten()
                    .filter_map(|f| match PartitionField::parse(&c.text(f)) {
                        Ok(p) => Some(p),
                        Err(message) => {
                            c.at(f, message);
                            None
                        }
                    })
                    .collect();
                let properties = t
                    .properties
                    .iter()
                    .map(|(k, v)| (k.clone(), c.text(v)))
                    .collect();
                table_configs.push(TableConfig {
                    key: key.get_ref().clone(),
                    // Without a name, the stream's own (`schema_table` outside `public`).
                    name: c.opt(t.name.as_ref()),
                    partition: t.partition.as_ref().map(|_| partition),
                    target_file_size: c.bytes(t.target_file_size.as_ref(), 128 * 1024 * 1024),
                    properties,
                });
            }
        }
        for spec in tables.iter().filter(|_| !change_source) {
            let raw_table = raw
                .tables
                .iter()
                .find(|(k, _)| k.get_ref() == &spec.name)
                .map(|(_, t)| t);
            let empty = RawTable::default();
            let t = raw_table.unwrap_or(&empty);
            let schema = spec.schema.as_ref();
            let partition = t.partition.as_ref().map(|fields| {
                fields
                    .iter()
                    .filter_map(|f| {
                        let text = c.text(f);
                        match PartitionField::parse(&text) {
                            Ok(p)
                                if schema.is_none_or(|s| s.field_by_name(&p.column).is_some()) =>
                            {
                                Some(p)
                            }
                            Ok(p) => {
                                c.at(
                                    f,
                                    format!("table {} has no column {:?}", spec.name, p.column),
                                );
                                None
                            }
                            Err(message) => {
                                c.at(f, message);
                                None
                            }
                        }
                    })
                    .collect()
            });
            let properties = t
                .properties
                .iter()
                .map(|(k, v)| (k.clone(), c.text(v)))
                .collect();
            table_configs.push(TableConfig {
                key: spec.name.clone(),
                name: c.opt(t.name.as_ref()),
                partition,
                target_file_size: c.bytes(t.target_file_size.as_ref(), 128 * 1024 * 1024),
                properties,
            });
        }
        let dead_letter_table = c
            .opt(raw.dead_letter.table.as_ref())
            .unwrap_or_else(|| "floe_dead_letters".into());
        let metrics_listen = c.opt(raw.metrics.listen.as_ref());

        if !c.problems.is_empty() {
            return Err(ConfigErrors(c.problems));
        }
        Ok(JobConfig {
            name,
            source: job_source.expect("checked above"),
            catalog: catalog.expect("checked above"),
            interval,
            max_buffered_bytes,
            state_dir,
            tables: table_configs,
            dead_letter_table,
            metrics_listen,
        })
    }
}

fn postgres(c: &mut Check<'_>, p: &RawPostgres, job: &str) -> PostgresSourceConfig {
    let port = match &p.port {
        Some(port) => {
            let value = match port.get_ref() {
                RawPort::Number(n) => Some(*n),
                RawPort::Text(text) => match floe_config::interpolate(text) {
                    Ok(text) => text.trim().parse::<i64>().ok(),
                    Err(e) => {
                        c.problems.push(c.source.problem(Some(port.span()), e));
                        Some(5432)
                    }
                },
            };
            match value.map(u16::try_from) {
                Some(Ok(v)) if v > 0 => v,
                _ => {
                    c.problems
                        .push(c.source.problem(Some(port.span()), "a port is 1 to 65535"));
                    5432
                }
            }
        }
        None => 5432,
    };
    let ssl_mode = c
        .opt(p.ssl_mode.as_ref())
        .unwrap_or_else(|| "disable".into());
    if !["disable", "require", "verify-ca", "verify-full"].contains(&ssl_mode.as_str())
        && let Some(raw) = &p.ssl_mode
    {
        c.at(
            raw,
            "ssl_mode is one of \"disable\", \"require\", \"verify-ca\", \"verify-full\"",
        );
    }
    let slot = c
        .opt(p.slot.as_ref())
        .unwrap_or_else(|| format!("floe_{}", job.replace(['-', '.'], "_")));
    if !slot
        .chars()
        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_')
        && let Some(raw) = &p.slot
    {
        c.at(
            raw,
            "a replication slot name is lower-case letters, digits and '_'",
        );
    }
    let tables: Vec<String> = p.tables.iter().flatten().map(|t| c.text(t)).collect();
    let snapshot_parallelism = match &p.snapshot_parallelism {
        Some(n) if *n.get_ref() >= 1 && *n.get_ref() <= 64 => *n.get_ref() as usize,
        Some(n) => {
            c.problems.push(
                c.source
                    .problem(Some(n.span()), "snapshot_parallelism is 1 to 64"),
            );
            1
        }
        None => 2,
    };
    PostgresSourceConfig {
        host: c.opt(p.host.as_ref()).unwrap_or_else(|| "localhost".into()),
        port,
        user: c.opt(p.user.as_ref()).unwrap_or_else(|| "postgres".into()),
        password: c.opt(p.password.as_ref()).unwrap_or_default(),
        database: c
            .opt(p.database.as_ref())
            .unwrap_or_else(|| "postgres".into()),
        ssl_mode,
        ssl_root_cert: c.opt(p.ssl_root_cert.as_ref()).map(PathBuf::from),
        publication: c
            .opt(p.publication.as_ref())
            .unwrap_or_else(|| format!("floe_{}", job.replace(['-', '.'], "_"))),
        slot,
        tables,
        snapshot_parallelism,
        replica_identity_full: p.replica_identity_full.unwrap_or(false),
        warn_retained_wal: c.bytes(p.warn_retained_wal.as_ref(), 1024 * 1024 * 1024),
    }
}

fn kafka(c: &mut Check<'_>, k: &RawKafka, job: &str) -> KafkaSourceConfig {
    let brokers = match &k.brokers {
        Some(b) => c.text(b),
        None => "localhost:9092".into(),
    };
    let topics = match &k.topics {
        Some(t) => t.iter().map(|t| c.text(t)).collect(),
        None => vec![
            "otlp_spans".into(),
            "otlp_logs".into(),
            "otlp_metrics".into(),
        ],
    };
    let start = match &k.start {
        None => StartAt::Earliest,
        Some(s) => match c.text(s).as_str() {
            "earliest" => StartAt::Earliest,
            "latest" => StartAt::Latest,
            other => {
                c.at(
                    s,
                    format!("start must be \"earliest\" or \"latest\", not {other:?}"),
                );
                StartAt::Earliest
            }
        },
    };
    let format = match &k.format {
        None => KafkaFormat::Otlp,
        Some(raw) => match c.text(raw).as_str() {
            "otlp" => KafkaFormat::Otlp,
            "debezium-json" => KafkaFormat::DebeziumJson,
            other => {
                c.at(
                    raw,
                    format!("format {other:?} is not supported; use \"otlp\" or \"debezium-json\""),
                );
                KafkaFormat::Otlp
            }
        },
    };
    if format == KafkaFormat::DebeziumJson && k.topics.is_none() {
        c.problems.push(c.source.problem(
            k.format.as_ref().map(|f| f.span()),
            "format \"debezium-json\" needs `topics`: Debezium's per-table topics \
             (<prefix>.<schema>.<table>)",
        ));
    }
    let mut signals = BTreeMap::new();
    for (topic, signal) in &k.signals {
        let text = c.text(signal);
        if !["traces", "logs", "metrics"].contains(&text.as_str()) {
            c.at(signal, "a signal is \"traces\", \"logs\" or \"metrics\"");
        }
        signals.insert(topic.clone(), text);
    }
    let properties = k
        .properties
        .iter()
        .map(|(key, v)| (key.clone(), c.text(v)))
        .collect();
    KafkaSourceConfig {
        brokers,
        topics,
        group_id: c
            .opt(k.group_id.as_ref())
            .unwrap_or_else(|| format!("floe-{job}")),
        start,
        signals,
        properties,
        format,
    }
}

fn generator(c: &mut Check<'_>, g: &RawGenerator) -> GeneratorConfig {
    let requests_per_second = match &g.requests_per_second {
        Some(r) if *r.get_ref() > 0 => *r.get_ref() as u64,
        Some(r) => {
            c.problems.push(
                c.source
                    .problem(Some(r.span()), "requests_per_second must be more than zero"),
            );
            1
        }
        None => 2_000,
    };
    let duration = g
        .duration
        .as_ref()
        .map(|d| c.duration(Some(d), Duration::from_secs(30)));
    GeneratorConfig {
        requests_per_second,
        duration,
        seed: g.seed.as_ref().map_or(42, |s| *s.get_ref() as u64),
    }
}
