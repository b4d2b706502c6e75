//! Job files: parsed, interpolated and validated; every problem reported at `file:line:col`.
//!
//! ```toml
//! version = 1
//! name = "otlp"                      # the job id in every commit marker
//!
//! [source.kafka]                     # the source's own section: see its crate
//! brokers = "${KAFKA_BROKERS:-localhost:9092}"
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
//! [tables.spans]                     # the table a stream lands in
//! name = "otel_spans"
//! partition = ["day(ts)"]
//! target_file_size = "128MiB"
//!
//! [dead_letter]
//! table = "floe_dead_letters"
//!
//! [metrics]
//! listen = "127.0.0.1:9464"
//! ```
//!
//! Every string value may use `${VAR}` and `${VAR:-default}`.
//!
//! The runtime names no concrete source: `[source]` is a [`SourceSection`] the binary
//! supplies, whose kinds (`[source.kafka]`, `[source.postgres]`, …) each live in their adapter
//! crate with their fields documented and checked there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floe_config::{Checker, ConfigErrors, Source, Text};
use floe_core::StreamSpec;
pub use floe_lake::tables::PartitionField;
use floe_ops::config::{
    OperatorKind, Pipeline, RawOperator, RawSlo, RawStream, check_pipeline, exchange_output,
    resolve_time,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use toml::Spanned;

/// The `[source]` table of a job file: one of the kinds an adapter crate provides.
pub trait SourceSection: DeserializeOwned {
    /// The checked source.
    type Config;

    /// Checks the section of job `job` (exactly one kind in it); `None` when it is wrong (the
    /// problems went to `c`).
    fn check(&self, c: &mut Checker<'_>, job: &str) -> Option<Self::Config>;

    /// The streams the source produces, as far as they are known before it runs.
    fn streams(config: &Self::Config) -> Streams;

    /// Whether the source's brokers can carry an exchange's topic (a Kafka source).
    fn carries_exchanges(_config: &Self::Config) -> bool {
        false
    }
}

/// What a job file can know of its source's streams.
#[derive(Debug, Clone)]
pub enum Streams {
    /// These streams (a format's tables).
    Known(Vec<StreamSpec>),
    /// Change streams of a database, named `schema.table`, discovered when the source connects.
    Tables,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob<S> {
    /// `version = 1`.
    version: Option<Spanned<i64>>,
    /// The job's stable id, written into every commit.
    name: Option<Text>,
    /// The source (one kind).
    source: Option<Spanned<S>>,
    /// The REST catalog.
    catalog: Option<Spanned<RawCatalog>>,
    #[serde(default)]
    checkpoint: RawCheckpoint,
    /// Per stream, the table that lands it.
    #[serde(default)]
    tables: BTreeMap<Text, RawTable>,
    #[serde(default)]
    dead_letter: RawDeadLetter,
    #[serde(default)]
    metrics: RawMetrics,
    /// Event-time settings per stream.
    #[serde(default)]
    streams: BTreeMap<Text, RawStream>,
    /// The pipeline's operators.
    #[serde(default)]
    operators: Vec<Spanned<RawOperator>>,
    /// Service level objectives, evaluated by the `slo` operator.
    #[serde(default)]
    slos: Vec<Spanned<RawSlo>>,
    #[serde(default)]
    state: RawState,
    /// Sinks beyond Iceberg: committed tables mirrored elsewhere.
    #[serde(default)]
    sinks: BTreeMap<Text, crate::mirror_config::RawSink>,
}

/// `[state]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    /// The Iceberg table of the operators' state (default `floe_state_{name}`).
    table: Option<Text>,
    /// Memory for the local RocksDB's caches and buffers (default `256MiB`); the state itself
    /// may be larger (it spills to the state directory).
    memory: Option<Text>,
}

/// `[catalog]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    /// The catalog's base URI (`http://` or `https://`).
    uri: Option<Text>,
    /// The warehouse name sent to the catalog.
    warehouse: Option<Text>,
    /// A bearer token (else `FLOE_CATALOG_TOKEN`).
    token: Option<Text>,
    /// OAuth2 client credentials, `id:secret` (else `FLOE_CATALOG_CREDENTIAL`).
    credential: Option<Text>,
    /// The namespace of the job's tables (default `default`).
    namespace: Option<Text>,
    /// Run a catalog inside the job process instead (the quickstart's).
    embedded: Option<RawEmbedded>,
}

/// `[catalog.embedded]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEmbedded {
    /// Warehouse root: `file://…`, a path, or `s3://…`.
    warehouse: Text,
    /// Listen address (default `127.0.0.1:0`, a free port).
    listen: Option<Text>,
}

/// `[checkpoint]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheckpoint {
    /// How often a checkpoint commits (default `10s`).
    interval: Option<Text>,
    /// Checkpoint early once this much was read (default `256MiB`).
    max_buffered_bytes: Option<Text>,
    /// Local state directory (default `.floe/{name}`).
    state_dir: Option<Text>,
}

/// `[tables.<stream>]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    /// The Iceberg table name (default: the stream's).
    name: Option<Text>,
    /// Partition fields of a new table, `transform(column)`.
    partition: Option<Vec<Text>>,
    /// Roll data files past this size (default `128MiB`).
    target_file_size: Option<Text>,
    /// Land the stream in a table (default true; false: the stream only feeds operators).
    land: Option<bool>,
    /// Table properties of a new table.
    #[serde(default)]
    properties: BTreeMap<String, Text>,
}

/// `[dead_letter]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeadLetter {
    /// The dead-letter (and anchor) table (default `floe_dead_letters`).
    table: Option<Text>,
}

/// `[metrics]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    /// Serve Prometheus `/metrics` there (default: off).
    listen: Option<Text>,
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
    /// Where its section is (`file:line:col`).
    pub place: String,
    /// Table name (default: the stream's).
    pub name: Option<String>,
    /// Partition spec of a new table (default: the stream's).
    pub partition: Option<Vec<PartitionField>>,
    /// Roll files past this size.
    pub target_file_size: u64,
    /// Table properties of a new table.
    pub properties: BTreeMap<String, String>,
    /// Whether the stream lands in a table.
    pub land: bool,
}

/// A validated job (its source apart: see [`JobConfig::from_toml`]).
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Job name (the id in commit markers).
    pub name: String,
    /// The job file, for messages (`<config>` when the job came from text).
    pub file: String,
    /// Catalog.
    pub catalog: CatalogConfig,
    /// Checkpoint interval.
    pub interval: Duration,
    /// Checkpoint early once this many payload bytes were read.
    pub max_buffered_bytes: u64,
    /// Local state directory.
    pub state_dir: PathBuf,
    /// Per-table settings.
    pub tables: Vec<TableConfig>,
    /// Dead-letter table name.
    pub dead_letter_table: String,
    /// Where `/metrics` listens (`None`: off).
    pub metrics_listen: Option<String>,
    /// The operators and the streams' event time.
    pub pipeline: Pipeline,
    /// The state table (stateful pipelines).
    pub state_table: String,
    /// Memory for the local state store.
    pub state_memory: u64,
    /// `[sinks.<id>]`: committed tables mirrored to other systems.
    pub sinks: Vec<crate::mirror_config::SinkConfig>,
}

impl JobConfig {
    /// The settings of a stream's table, if the job file has a section for it.
    pub fn table(&self, stream: &str) -> Option<&TableConfig> {
        self.tables.iter().find(|t| t.key == stream)
    }

    /// Whether `stream` lands in a table.
    pub fn lands(&self, stream: &str) -> bool {
        self.table(stream).is_none_or(|t| t.land)
    }

    /// Reads and validates a job file.
    pub fn load<S: SourceSection>(path: &Path) -> Result<(Self, S::Config), ConfigErrors> {
        let text = floe_config::read(path)?;
        Self::from_toml::<S>(Some(path), &text)
    }

    /// Validates job TOML; returns the job and its checked source.
    pub fn from_toml<S: SourceSection>(
        file: Option<&Path>,
        text: &str,
    ) -> Result<(Self, S::Config), ConfigErrors> {
        let source = Source { file, text };
        let raw: RawJob<S> = floe_config::parse(source)?;
        let mut c = Checker::new(source);
        c.version(raw.version.as_ref());

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
                c.problem(None, "`name` is required");
                String::new()
            }
        };
        let job_source = match &raw.source {
            None => {
                c.problem(None, "a [source] section is required, e.g. [source.kafka]");
                None
            }
            Some(section) => section.get_ref().check(&mut c, &name),
        };
        let streams = job_source.as_ref().map(S::streams);
        let catalog = raw.catalog.as_ref().map(|spanned| catalog(&mut c, spanned));
        if catalog.is_none() {
            c.problem(None, "a [catalog] section is required");
        }
        let interval = c.duration(raw.checkpoint.interval.as_ref(), Duration::from_secs(10));
        let max_buffered_bytes = c.bytes(
            raw.checkpoint.max_buffered_bytes.as_ref(),
            256 * 1024 * 1024,
        );
        let state_dir = c
            .opt(raw.checkpoint.state_dir.as_ref())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!(".floe/{name}")));
        let known = match &streams {
            Some(Streams::Known(known)) => Some(known.as_slice()),
            _ => None,
        };
        let mut pipeline = check_pipeline(&mut c, &raw.streams, &raw.operators, &raw.slos, known);
        check_operators(&mut c, &mut pipeline, known);
        if let Some(config) = &job_source
            && known.is_some()
            && !S::carries_exchanges(config)
        {
            for op in &pipeline.operators {
                if matches!(op.kind, OperatorKind::Exchange(_)) {
                    c.at_place(
                        &op.place,
                        format!(
                            "operator {}: an exchange needs [source.kafka]: its topic lives on \
                             the job's brokers, and the job reads it back",
                            op.id
                        ),
                    );
                }
            }
        }
        let derived: Vec<String> = pipeline
            .operators
            .iter()
            .flat_map(|o| o.outputs.clone())
            .collect();
        let tables = raw
            .tables
            .iter()
            .map(|(key, t)| table(&mut c, key, t, streams.as_ref(), &derived))
            .collect();
        let state_table = c
            .opt(raw.state.table.as_ref())
            .unwrap_or_else(|| crate::state_table::default_name(&name));
        let state_memory = c.bytes(raw.state.memory.as_ref(), 256 * 1024 * 1024);
        let dead_letter_table = c
            .opt(raw.dead_letter.table.as_ref())
            .unwrap_or_else(|| "floe_dead_letters".into());
        let metrics_listen = c.opt(raw.metrics.listen.as_ref());
        let sinks = {
            let lands = |stream: &str| {
                let exists = derived.iter().any(|d| d == stream)
                    || match &streams {
                        Some(Streams::Known(known)) => known.iter().any(|s| s.name == stream),
                        _ => true,
                    };
                exists.then(|| {
                    !raw.tables
                        .iter()
                        .any(|(key, t)| key.get_ref() == stream && t.land == Some(false))
                })
            };
            crate::mirror_config::check(&mut c, &raw.sinks, &name, &pipeline, lands)
        };
        c.finish(|| {
            (
                JobConfig {
                    name,
                    file: source.place(None),
                    catalog: catalog.expect("checked above"),
                    interval,
                    max_buffered_bytes,
                    state_dir,
                    tables,
                    dead_letter_table,
                    metrics_listen,
                    pipeline,
                    state_table,
                    state_memory,
                    sinks,
                },
                job_source.expect("checked above"),
            )
        })
    }
}

fn catalog(c: &mut Checker<'_>, spanned: &Spanned<RawCatalog>) -> CatalogConfig {
    let r = spanned.get_ref();
    let embedded = r.embedded.as_ref().map(|e| EmbeddedCatalog {
        warehouse: c.text(&e.warehouse),
        listen: c
            .opt(e.listen.as_ref())
            .unwrap_or_else(|| "127.0.0.1:0".into()),
    });
    let uri = c.opt(r.uri.as_ref());
    match (&uri, &embedded) {
        (None, None) => c.at(
            spanned,
            "give the catalog's `uri`, or [catalog.embedded] to run one in-process",
        ),
        (Some(_), Some(_)) => c.at(spanned, "`uri` and [catalog.embedded] exclude each other"),
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
    CatalogConfig {
        uri,
        warehouse: c.opt(r.warehouse.as_ref()),
        // Unset in the file: the environment's, as floe-maintenance does (a Kubernetes Secret).
        token: c
            .opt(r.token.as_ref())
            .or_else(floe_config::catalog_token_from_env),
        credential: c
            .opt(r.credential.as_ref())
            .or_else(floe_config::catalog_credential_from_env),
        namespace: c
            .opt(r.namespace.as_ref())
            .unwrap_or_else(|| "default".into()),
        embedded,
    }
}

/// Fills in the windows' event time and builds every operator whose input's columns are known
/// (a select's SQL, a window's columns), so that problems show at load time.
fn check_operators(c: &mut Checker<'_>, pipeline: &mut Pipeline, known: Option<&[StreamSpec]>) {
    for (place, id) in resolve_time(pipeline, known.unwrap_or_default()) {
        c.at_place(
            &place,
            format!(
                "operator {id} has no time column: its input stream has none; set `time_column` \
                 (or [streams.<input>] time_column)"
            ),
        );
    }
    let Some(known) = known else {
        for op in &pipeline.operators {
            if matches!(op.kind, OperatorKind::Exchange(_)) {
                c.at_place(
                    &op.place,
                    format!(
                        "operator {}: an exchange re-keys the streams of a Kafka job; a change \
                         stream is keyed by its table already",
                        op.id
                    ),
                );
            }
        }
        return;
    };
    for (place, problem) in derive_streams(pipeline, known).1 {
        c.at_place(&place, problem);
    }
}

/// Every stream of the pipeline over the source's `known` streams — each operator built to
/// learn its outputs, an exchange's output its input renamed — and the problems found, with
/// the operator's place.
pub fn derive_streams(
    pipeline: &Pipeline,
    known: &[StreamSpec],
) -> (Vec<StreamSpec>, Vec<(String, String)>) {
    let mut specs: Vec<StreamSpec> = known.to_vec();
    let mut problems = Vec::new();
    for op in &pipeline.operators {
        let Some(inputs) = op
            .inputs
            .iter()
            .map(|name| specs.iter().find(|s| &s.name == name).cloned())
            .collect::<Option<Vec<StreamSpec>>>()
        else {
            continue;
        };
        let built = match &op.kind {
            OperatorKind::Exchange(_) => exchange_output(op, &inputs[0]).map(|out| vec![out]),
            _ => op.build_over(&inputs).map(|built| built.outputs().to_vec()),
        };
        match built {
            Ok(outputs) => specs.extend(outputs),
            Err(e) => problems.push((op.place.clone(), format!("operator {}: {e}", op.id))),
        }
    }
    (specs, problems)
}

/// A `[tables.<stream>]` section, checked against the streams the source is known to have and
/// those operators produce.
fn table(
    c: &mut Checker<'_>,
    key: &Text,
    t: &RawTable,
    streams: Option<&Streams>,
    derived: &[String],
) -> TableConfig {
    let spec = match streams {
        _ if derived.contains(key.get_ref()) => None,
        Some(Streams::Known(known)) => {
            let spec = known.iter().find(|s| &s.name == key.get_ref());
            if spec.is_none() {
                let names: Vec<&str> = known.iter().map(|s| s.name.as_str()).collect();
                c.at(
                    key,
                    format!(
                        "no stream {:?} in this job; its streams are {names:?}",
                        key.get_ref()
                    ),
                );
            }
            spec
        }
        Some(Streams::Tables) => {
            if !key.get_ref().contains('.') {
                c.at(
                    key,
                    "a CDC table is named `schema.table`, e.g. [tables.\"public.orders\"]",
                );
            }
            None
        }
        None => None,
    };
    let schema = spec.and_then(|s| s.schema.as_ref());
    let partition = t.partition.as_ref().map(|fields| {
        fields
            .iter()
            .filter_map(|f| match PartitionField::parse(&c.text(f)) {
                Ok(p) if schema.is_none_or(|s| s.field_by_name(&p.column).is_some()) => Some(p),
                Ok(p) => {
                    c.at(
                        f,
                        format!("table {} has no column {:?}", key.get_ref(), p.column),
                    );
                    None
                }
                Err(message) => {
                    c.at(f, message);
                    None
                }
            })
            .collect()
    });
    TableConfig {
        key: key.get_ref().clone(),
        place: c.place(key),
        // Without a name, the stream's own (`schema_table` outside `public` for CDC).
        name: c.opt(t.name.as_ref()),
        partition,
        target_file_size: c.bytes(t.target_file_size.as_ref(), 128 * 1024 * 1024),
        properties: t
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), c.text(v)))
            .collect(),
        land: t.land.unwrap_or(true),
    }
}
