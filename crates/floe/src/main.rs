//! The `floe` command: runs and checks job files.
//!
//! * `floe run JOB.toml` — runs the job until SIGTERM/SIGINT, then takes a final checkpoint and
//!   exits 0 (a bounded source, like the quickstart generator with a duration, ends by itself);
//! * `floe validate FILE...` — checks job files without running them; every problem is printed
//!   as `file:line:col: message`, and the exit code is 2 if there was any;
//! * `floe quickstart` — runs `jobs/quickstart.toml` (built in): generated OpenTelemetry data
//!   into Iceberg through an embedded catalog, then prints how to query it with DuckDB.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use floe_cdc::postgres::PostgresSource;
use floe_core::Format;
use floe_kafka::KafkaSource;
use floe_kafka::exchange::{KafkaExchange, TopicSpec};
use floe_kafka::mirror::{KafkaMirror, KafkaMirrorSettings};
use floe_lake::rest::{CatalogClient, CatalogSettings};
use floe_lake::savepoint;
use floe_otlp::{GeneratorSource, OtlpFormat};
use floe_prometheus::{PrometheusMirror, PrometheusSettings, SeriesSpec};
use floe_runtime::exchange::{self, ExchangeFormat, Outbound};
use floe_runtime::job::SourceSection;
use floe_runtime::mirror::MirrorSink;
use floe_runtime::mirror_config::SinkTarget;
use floe_runtime::{Job, JobConfig, JobMetrics, RecordReader, RunOptions, RunSummary};
use source::{KafkaFormat, RawSource, SourceConfig};
use tokio_util::sync::CancellationToken;

mod findings;
mod graph;
mod source;

// Decoding allocates many small objects; mimalloc roughly doubles prost's decoding rate over
// glibc's allocator (`cargo bench -p floe-otlp --bench decode`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const QUICKSTART: &str = include_str!("../../../jobs/quickstart.toml");

/// The version `--version` prints: the package version, and the build's tag when it was built
/// with `FLOE_BUILD_TAG` set (packagers stamp a commit or a release name this way).
static VERSION: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| match option_env!("FLOE_BUILD_TAG") {
        Some(tag) if !tag.is_empty() => format!("{} ({tag})", env!("CARGO_PKG_VERSION")),
        _ => env!("CARGO_PKG_VERSION").to_string(),
    });

/// Streams into Apache Iceberg tables, exactly once.
#[derive(Debug, Parser)]
#[command(name = "floe", version = VERSION.as_str())]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log as JSON lines.
    #[arg(long, global = true, env = "FLOE_LOG_JSON")]
    log_json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a job until SIGTERM or SIGINT (then a final checkpoint).
    Run {
        /// The job file.
        job: PathBuf,
        /// Go back to this savepoint first: the job's tables return to it, and the job reads
        /// again from its positions with its state (`floe savepoint`).
        #[arg(long, value_name = "NAME")]
        from_savepoint: Option<String>,
        /// Drop the committed state of this stateful operator, which the job file removed or
        /// changed incompatibly (repeatable).
        #[arg(long, value_name = "ID")]
        allow_state_reset: Vec<String>,
        /// Rename this stream's committed table to the name the job file now gives it, instead
        /// of refusing the edit (repeatable; e.g. `--rename-table shop.orders`).
        #[arg(long, value_name = "STREAM")]
        rename_table: Vec<String>,
        /// Stop following this stream, which the job committed but the job file no longer
        /// reads; its table stays as it is (repeatable).
        #[arg(long, value_name = "STREAM")]
        stop_following: Vec<String>,
    },
    /// Check job files without running them, and show each one's pipeline.
    Validate {
        /// Job files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Keep the job's newest checkpoint as a named savepoint (or list or delete them).
    Savepoint {
        /// The job file.
        job: PathBuf,
        /// The savepoint's name.
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// List the job's savepoints.
        #[arg(long, conflicts_with = "delete")]
        list: bool,
        /// Delete the savepoint.
        #[arg(long)]
        delete: bool,
    },
    /// Change data capture jobs.
    #[command(subcommand)]
    Cdc(CdcCommand),
    /// Generated OpenTelemetry data into Iceberg, with no services; then query it with DuckDB.
    Quickstart {
        /// Directory for the warehouse and the catalog database.
        #[arg(long, default_value = "floe-quickstart")]
        dir: PathBuf,
        /// How long to generate data.
        #[arg(long, default_value = "30s")]
        duration: String,
    },
}

#[derive(Debug, Subcommand)]
enum CdcCommand {
    /// Copy one table of a Postgres job again (e.g. after it was restored from a backup): the
    /// running job empties its Iceberg table and copies it by an incremental snapshot while
    /// the stream goes on (a job that is down does it when it starts).
    Resnapshot {
        /// The job file.
        job: PathBuf,
        /// The table, `schema.table`.
        table: String,
    },
}

fn load(path: &Path) -> Result<(JobConfig, SourceConfig), floe_config::ConfigErrors> {
    JobConfig::load::<RawSource>(path)
}

/// The job's catalog: a client of it, and the catalog itself when it runs in this process.
async fn catalog(
    config: &JobConfig,
) -> anyhow::Result<(Option<floe_catalog::RunningCatalog>, CatalogClient)> {
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot create {}", config.state_dir.display()))?;
    let embedded = match &config.catalog.embedded {
        Some(e) => {
            let store = config.state_dir.join("catalog.db");
            let catalog_config = floe_catalog::config::CatalogConfig::load(
                None,
                &floe_catalog::config::Overrides {
                    listen: Some(e.listen.clone()),
                    warehouse: Some(e.warehouse.clone()),
                    store: Some(format!("sqlite://{}", absolute(&store)?.display())),
                    ..Default::default()
                },
            )
            .map_err(|e| anyhow::anyhow!("embedded catalog: {e}"))?;
            if let Some(dir) = e
                .warehouse
                .strip_prefix("file://")
                .map(PathBuf::from)
                .or_else(|| (!e.warehouse.contains("://")).then(|| PathBuf::from(&e.warehouse)))
            {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let running = floe_catalog::start(&catalog_config)
                .await
                .map_err(|e| anyhow::anyhow!("embedded catalog: {e}"))?;
            tracing::info!(uri = %running.uri(), "embedded catalog started");
            Some(running)
        }
        None => None,
    };
    let uri = match (&embedded, &config.catalog.uri) {
        (Some(running), _) => running.uri(),
        (None, Some(uri)) => uri.clone(),
        (None, None) => bail!("no catalog"),
    };
    let client = CatalogClient::connect(CatalogSettings {
        uri,
        warehouse: config.catalog.warehouse.clone(),
        token: config.catalog.token.clone(),
        credential: config.catalog.credential.clone(),
        ..Default::default()
    })
    .await
    .context("cannot reach the catalog")?;
    Ok((embedded, client))
}

/// What every kind of job is opened with.
struct Runner {
    config: JobConfig,
    client: CatalogClient,
    metrics: JobMetrics,
    options: RunOptions,
    shutdown: CancellationToken,
}

impl Runner {
    /// Opens and runs the job on `reader`, with the exchanges' producer when it has
    /// exchanges; `kafka` is the Kafka source's settings (a sink's default brokers).
    async fn drive<R: floe_core::Reader>(
        self,
        reader: R,
        kafka: Option<&floe_kafka::KafkaSettings>,
        outbound: Option<Outbound>,
    ) -> anyhow::Result<RunSummary> {
        let sinks = mirrors(&self.config, kafka)?;
        let mut job =
            Job::open_with(self.config, self.client, reader, self.metrics, self.options).await?;
        if let Some(outbound) = outbound {
            job = job.with_exchanges(outbound);
        }
        Ok(job.with_mirrors(sinks).run(self.shutdown).await?)
    }
}

/// The job's `[sinks]`, built; a Kafka sink without `brokers` uses the Kafka source's (and its
/// properties).
fn mirrors(
    config: &JobConfig,
    source: Option<&floe_kafka::KafkaSettings>,
) -> anyhow::Result<Vec<MirrorSink>> {
    let mut built = Vec::new();
    for sink in &config.sinks {
        let target: Arc<dyn floe_core::Mirror> = match &sink.target {
            SinkTarget::Kafka {
                topic,
                key,
                brokers,
                partitions,
                properties,
            } => {
                let (brokers, mut merged) = match (brokers, source) {
                    (Some(b), _) => (b.clone(), Default::default()),
                    (None, Some(s)) => (s.brokers.clone(), s.properties.clone()),
                    (None, None) => bail!(
                        "{}: sink {} needs `brokers` (the job's source is not Kafka)",
                        sink.place,
                        sink.id
                    ),
                };
                merged.extend(properties.clone());
                Arc::new(KafkaMirror::new(KafkaMirrorSettings {
                    brokers,
                    topic: topic.clone(),
                    key: key.clone(),
                    partitions: *partitions,
                    transactional_id: format!("floe.{}.{}", config.name, sink.id),
                    properties: merged,
                }))
            }
            SinkTarget::Prometheus {
                url,
                metric,
                time,
                labels,
                values,
            } => Arc::new(PrometheusMirror::new(PrometheusSettings {
                url: url.clone(),
                query_url: PrometheusSettings::query_url_of(url),
                sink: format!("{}.{}", config.name, sink.id),
                series: SeriesSpec {
                    metric: metric.clone(),
                    time: time.clone(),
                    labels: labels.clone(),
                    values: values.clone(),
                },
            })?),
        };
        // Without an exchange before the stream, the source's first partition is home.
        let home = sink.home.clone().or_else(|| {
            let topic = source?.topics.first()?;
            Some(floe_core::position_key(topic, 0))
        });
        built.push(MirrorSink {
            id: sink.id.clone(),
            stream: sink.stream.clone(),
            home,
            target,
        });
    }
    Ok(built)
}

/// Runs a validated job; returns what it did.
async fn run(
    config: JobConfig,
    source: SourceConfig,
    options: RunOptions,
    from_savepoint: Option<String>,
    shutdown: CancellationToken,
) -> anyhow::Result<RunSummary> {
    // Refused before anything is reached: a redaction that hashes without its key.
    if let Some(r) = source.redaction() {
        r.redactor().map_err(anyhow::Error::msg)?;
    }
    let (embedded, client) = catalog(&config).await?;
    if let Some(name) = &from_savepoint {
        let anchor = savepoint::ident(&config.catalog.namespace, &config.dead_letter_table);
        let rewound = savepoint::rewind(&client, &anchor, &config.name, name).await?;
        for (table, snapshots) in &rewound.tables {
            tracing::warn!(%table, snapshots, savepoint = %name, "table back at the savepoint");
        }
        tracing::info!(savepoint = %name, tables = rewound.tables.len(), "resuming from the savepoint");
    }

    let metrics = JobMetrics::new();
    metrics.page.describe(
        &config.name,
        &graph::describe(&config, &RawSource::streams(&source)),
    );
    if let Some(listen) = &config.metrics_listen {
        let addr = metrics
            .serve(listen)
            .await
            .with_context(|| format!("cannot serve metrics on {listen}"))?;
        tracing::info!(%addr, "status page at /, metrics at /metrics");
    }
    let bytes = Some(metrics.bytes.clone());
    let runner = Runner {
        config,
        client,
        metrics,
        options,
        shutdown,
    };
    let config = &runner.config;
    let summary = match source {
        SourceConfig::Kafka(mut settings, format) => match format {
            KafkaFormat::DebeziumJson => {
                let kafka = KafkaSource::connect(&settings)?;
                let reader = RecordReader::new(kafka, source::debezium(config), bytes);
                runner.drive(reader, Some(&settings), None).await?
            }
            KafkaFormat::Otlp {
                signals,
                team_attribute,
                redaction,
            } => {
                let format = redacting(
                    OtlpFormat::new(signals).team_attribute(team_attribute),
                    redaction.as_deref(),
                )?;
                let exchanges =
                    exchange::exchanges(&config.name, &config.pipeline, &format.streams());
                if exchanges.is_empty() {
                    let kafka = KafkaSource::connect(&settings)?;
                    let reader = RecordReader::new(kafka, format, bytes);
                    runner.drive(reader, Some(&settings), None).await?
                } else {
                    // The job reads its exchange topics back, from their first record.
                    for x in &exchanges {
                        let topic = TopicSpec {
                            name: x.topic.clone(),
                            partitions: x.partitions,
                            retention_ms: x.retention_ms,
                            replication: x.replication,
                        };
                        floe_kafka::exchange::ensure_topic(&settings, &topic).await?;
                        settings.earliest_topics.push(x.topic.clone());
                    }
                    // Clock records say how many source partitions a clock waits for.
                    let mut source_partitions = HashMap::new();
                    for topic in &settings.topics {
                        let count =
                            floe_kafka::exchange::topic_partitions(&settings, topic).await?;
                        source_partitions.insert(topic.clone(), count);
                    }
                    // Rows derived behind one exchange may go through another (ADR 0010).
                    for x in &exchanges {
                        source_partitions.insert(x.topic.clone(), x.partitions);
                    }
                    let producer = Arc::new(KafkaExchange::connect(&settings)?);
                    let kafka = KafkaSource::connect(&settings)?;
                    let format = ExchangeFormat::new(format, &exchanges);
                    let reader = RecordReader::new(kafka, format, bytes);
                    let outbound = Outbound::new(producer, exchanges, source_partitions);
                    runner
                        .drive(reader, Some(&settings), Some(outbound))
                        .await?
                }
            }
        },
        SourceConfig::Generator(g, redaction) => {
            let generator = GeneratorSource::new(&g);
            let format = redacting(
                OtlpFormat::new(HashMap::new()).one_partition(),
                redaction.as_deref(),
            )?;
            let reader = RecordReader::new(generator, format, bytes);
            runner.drive(reader, None, None).await?
        }
        SourceConfig::Postgres(mut p) => {
            p.table_names = source::table_names(config);
            let reader = PostgresSource::connect(p).await?;
            runner.drive(reader, None, None).await?
        }
    };
    if let Some(running) = embedded {
        running.stop().await?;
    }
    Ok(summary)
}

/// `floe savepoint`: take, list or delete savepoints of a job.
async fn savepoints(
    config: &JobConfig,
    name: Option<&str>,
    list: bool,
    delete: bool,
) -> anyhow::Result<()> {
    let (embedded, client) = catalog(config).await?;
    let anchor = savepoint::ident(&config.catalog.namespace, &config.dead_letter_table);
    let job = &config.name;
    if list {
        for sp in savepoint::list(&client, &anchor, job).await? {
            let at = sp.marker.as_ref().map_or(0, |m| m.checkpoint_id);
            println!(
                "{}	snapshot {}	checkpoint {at}	{} ms",
                sp.name, sp.snapshot_id, sp.timestamp_ms
            );
        }
    } else if let Some(name) = name {
        if delete {
            let n = savepoint::delete(&client, &anchor, job, name).await?;
            println!("savepoint {name} of job {job} deleted from {n} tables");
        } else {
            let sp = savepoint::create(&client, &anchor, job, name).await?;
            println!(
                "savepoint {name} of job {job}: checkpoint {} of writer {}, {} tables tagged {}",
                sp.marker.as_ref().map_or(0, |m| m.checkpoint_id),
                sp.marker
                    .as_ref()
                    .and_then(|m| m.writer.clone())
                    .unwrap_or_default(),
                sp.tables.len(),
                savepoint::tag(job, name)
            );
            println!("resume with: floe run JOB.toml --from-savepoint {name}");
        }
    }
    if let Some(running) = embedded {
        running.stop().await?;
    }
    Ok(())
}

/// `format`, redacting under `redaction` when the job has `[source.redaction]` (refused
/// when an action hashes and its key is not in the environment).
fn redacting(
    format: OtlpFormat,
    redaction: Option<&floe_otlp::redact::Redaction>,
) -> anyhow::Result<OtlpFormat> {
    Ok(match redaction {
        Some(r) => format.redacting(r.redactor().map_err(anyhow::Error::msg)?),
        None => format,
    })
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    Ok(if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    })
}

/// The newest metadata file of each table under a local warehouse (for DuckDB's
/// `iceberg_scan`).
fn newest_metadata(warehouse: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let Ok(namespaces) = std::fs::read_dir(warehouse) else {
        return out;
    };
    for ns in namespaces.flatten() {
        for table in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
            let newest = std::fs::read_dir(table.path().join("metadata"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with(".metadata.json"))
                .max_by_key(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.split('-').next())
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                });
            if let Some(path) = newest {
                // Table directories are `{table}-{uuid without dashes}`.
                let dir = table.file_name().to_string_lossy().to_string();
                let name = dir.rsplit_once('-').map_or(dir.as_str(), |(n, _)| n);
                out.push((name.to_string(), path));
            }
        }
    }
    out.sort();
    out
}

async fn quickstart(dir: &Path, duration: &str, shutdown: CancellationToken) -> anyhow::Result<()> {
    // The built-in job's defaults, replaced by the flags.
    let text = QUICKSTART
        .replace(
            "${FLOE_QUICKSTART_DIR:-floe-quickstart}",
            &dir.display().to_string(),
        )
        .replace("${FLOE_QUICKSTART_DURATION:-30s}", duration);
    let (config, source) =
        JobConfig::from_toml::<RawSource>(Some(Path::new("jobs/quickstart.toml")), &text)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "floe quickstart: generating OpenTelemetry data for {duration} into {}/warehouse",
        dir.display()
    );
    let summary = run(
        config.clone(),
        source,
        RunOptions::default(),
        None,
        shutdown,
    )
    .await?;
    let warehouse = absolute(&dir.join("warehouse"))?;
    println!(
        "\n{} checkpoints committed; rows: {}",
        summary.checkpoints,
        summary
            .rows
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| format!("{t} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("\nQuery it with DuckDB (INSTALL iceberg; LOAD iceberg; once):\n");
    for (table, metadata) in newest_metadata(&warehouse) {
        if table == "otel_spans" {
            println!(
                "  SELECT service_name, count(*) AS spans, round(avg(duration_ns) / 1e6, 1) AS avg_ms,\n         count(*) FILTER (WHERE status_code = 'ERROR') AS errors\n  FROM iceberg_scan('{}') GROUP BY ALL ORDER BY spans DESC;\n",
                metadata.display()
            );
        } else if table == "otel_logs" {
            println!(
                "  SELECT severity_text, count(*) FROM iceberg_scan('{}') GROUP BY ALL;\n",
                metadata.display()
            );
        } else if table == "otel_slo_status" {
            println!(
                "  SELECT window_end, slo, good, total, burn_rate_1h, budget_remaining, page_1h, page_6h\n  FROM iceberg_scan('{}') ORDER BY window_end DESC, slo LIMIT 10;\n",
                metadata.display()
            );
        } else if table == "otel_deploy_regressions" {
            println!(
                "  SELECT decided_at, service_name, old_version, new_version, metric, old_value, new_value, p_value, verdict\n  FROM iceberg_scan('{}') ORDER BY decided_at, service_name, metric;\n",
                metadata.display()
            );
        }
    }

    println!(
        "Or serve the catalog and ATTACH it:\n\n  floe-catalog --warehouse {} --store sqlite://{}\n  ATTACH 'floe' AS lake (TYPE iceberg, ENDPOINT 'http://127.0.0.1:8181', AUTHORIZATION_TYPE 'none');\n  SELECT count(*) FROM lake.otel.otel_spans;",
        warehouse.display(),
        absolute(&dir.join("state/catalog.db"))?.display()
    );
    if let Err(e) = findings::print(&config).await {
        eprintln!("floe quickstart: cannot read the SLO status and the deploys back: {e:#}");
    }
    Ok(())
}

/// A token cancelled on the first SIGTERM or SIGINT, listening from now on.
fn stopping() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    let signal = floe_process::shutdown_signal();
    tokio::spawn(async move {
        signal.await;
        on_signal.cancel();
    });
    shutdown
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Jobs listen from the first instant: a SIGTERM while one still starts (reading its file,
    // connecting, creating tables) stops it cleanly once it can, with nothing to commit. The
    // other commands keep the default (a signal ends them).
    let runs_a_job = matches!(
        cli.command,
        Command::Run { .. } | Command::Quickstart { .. }
    );
    let shutdown = if runs_a_job {
        stopping()
    } else {
        CancellationToken::new()
    };
    floe_process::init_logs(cli.log_json, "info");
    let result = match cli.command {
        Command::Validate { files } => {
            let mut failed = false;
            for file in &files {
                match load(file) {
                    Ok((config, source)) => {
                        println!("{}: ok", file.display());
                        print!("{}", graph::describe(&config, &RawSource::streams(&source)));
                    }
                    Err(errors) => {
                        failed = true;
                        eprintln!("{errors}");
                    }
                }
            }
            return if failed {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
        Command::Run {
            job,
            from_savepoint,
            allow_state_reset,
            rename_table,
            stop_following,
        } => match load(&job) {
            Ok((config, source)) => {
                let options = RunOptions {
                    allow_state_reset,
                    rename_tables: rename_table,
                    stop_following,
                };
                run(config, source, options, from_savepoint, shutdown)
                    .await
                    .map(|summary| {
                        tracing::info!(?summary, "job stopped");
                    })
            }
            Err(errors) => {
                eprintln!("{errors}");
                return ExitCode::from(2);
            }
        },
        Command::Savepoint {
            job,
            name,
            list,
            delete,
        } => match load(&job) {
            Ok((config, _)) => savepoints(&config, name.as_deref(), list, delete).await,
            Err(errors) => {
                eprintln!("{errors}");
                return ExitCode::from(2);
            }
        },
        Command::Cdc(CdcCommand::Resnapshot { job, table }) => match load(&job) {
            Ok((_, SourceConfig::Postgres(p))) => {
                let table = if table.contains('.') {
                    table
                } else {
                    format!("public.{table}")
                };
                floe_cdc::postgres::request_resnapshot(&p, &table)
                    .await
                    .map(|lsn| {
                        println!(
                            "re-snapshot of {table} requested at LSN {lsn}; the job logs \
                             `incremental snapshot complete table={table}` when it is done"
                        );
                    })
                    .map_err(anyhow::Error::from)
            }
            Ok(_) => Err(anyhow::anyhow!(
                "{}: `floe cdc resnapshot` is for Postgres jobs ([source.postgres])",
                job.display()
            )),
            Err(errors) => {
                eprintln!("{errors}");
                return ExitCode::from(2);
            }
        },
        Command::Quickstart { dir, duration } => quickstart(&dir, &duration, shutdown).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floe: {e:#}");
            ExitCode::FAILURE
        }
    }
}
