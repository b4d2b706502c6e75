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

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use floe_cdc::debezium::DebeziumFormat;
use floe_cdc::postgres::{PostgresConfig, PostgresSource, SslMode};
use floe_core::Format;
use floe_kafka::{KafkaSettings, KafkaSource};
use floe_lake::rest::{CatalogClient, CatalogSettings};
use floe_otlp::{GeneratorSource, OtlpFormat, Signal};
use floe_runtime::job::{KafkaFormat, SourceConfig};
use floe_runtime::{Job, JobConfig, JobMetrics, RecordReader, RunSummary};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

// Decoding allocates many small objects; mimalloc roughly doubles prost's decoding rate over
// glibc's allocator (`cargo bench -p floe-otlp --bench decode`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const QUICKSTART: &str = include_str!("../../../jobs/quickstart.toml");

/// Streams into Apache Iceberg tables, exactly once.
#[derive(Debug, Parser)]
#[command(name = "floe", version)]
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
    },
    /// Check job files without running them.
    Validate {
        /// Job files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Generated OpenTelemetry data into Iceberg, with no services; then query it with DuckDB.
    Quickstart {
        /// Directory for the warehouse and the catalog database.
        #[arg(long, default_value = "floe-quickstart")]
        dir: PathBuf,
        /// How long to generate data.
        #[arg(long, default_value = "20s")]
        duration: String,
    },
}

fn otlp_format(config: Option<&JobConfig>) -> OtlpFormat {
    let signals: HashMap<String, Signal> = match config.map(|c| &c.source) {
        Some(SourceConfig::Kafka(k)) => k
            .signals
            .iter()
            .filter_map(|(topic, s)| Signal::parse(s).map(|s| (topic.clone(), s)))
            .collect(),
        _ => HashMap::new(),
    };
    OtlpFormat::new(signals)
}

fn load(path: &Path) -> Result<JobConfig, floe_config::ConfigErrors> {
    JobConfig::load(path, &otlp_format(None).streams())
}

/// Runs a validated job; returns what it did and, for an embedded catalog, its warehouse.
async fn run(config: JobConfig) -> anyhow::Result<RunSummary> {
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

    let metrics = JobMetrics::new();
    if let Some(listen) = &config.metrics_listen {
        let addr = metrics
            .serve(listen)
            .await
            .with_context(|| format!("cannot serve metrics on {listen}"))?;
        tracing::info!(%addr, "metrics at /metrics");
    }
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        floe_process::shutdown_signal().await;
        on_signal.cancel();
    });
    let format = otlp_format(Some(&config));
    let bytes = Some(metrics.bytes.clone());
    let summary = match config.source.clone() {
        SourceConfig::Kafka(k) => {
            let kafka = KafkaSource::connect(&KafkaSettings {
                brokers: k.brokers,
                topics: k.topics,
                group_id: k.group_id,
                start: k.start,
                properties: k.properties,
            })?;
            if k.format == KafkaFormat::DebeziumJson {
                let reader =
                    RecordReader::new(kafka, DebeziumFormat::new(table_names(&config)), bytes);
                Job::open(config, client, reader, metrics)
                    .await?
                    .run(shutdown)
                    .await?
            } else {
                let reader = RecordReader::new(kafka, format, bytes);
                Job::open(config, client, reader, metrics)
                    .await?
                    .run(shutdown)
                    .await?
            }
        }
        SourceConfig::Generator(g) => {
            let source = GeneratorSource::new(g.seed, g.requests_per_second, g.duration);
            let reader = RecordReader::new(source, format, bytes);
            Job::open(config, client, reader, metrics)
                .await?
                .run(shutdown)
                .await?
        }
        SourceConfig::Postgres(p) => {
            let source = PostgresSource::connect(postgres_config(&config, p)?).await?;
            Job::open(config, client, source, metrics)
                .await?
                .run(shutdown)
                .await?
        }
    };
    if let Some(running) = embedded {
        running.stop().await?;
    }
    Ok(summary)
}

/// The source settings of a Postgres job, with the job's table names.
fn postgres_config(
    job: &JobConfig,
    p: floe_runtime::job::PostgresSourceConfig,
) -> anyhow::Result<PostgresConfig> {
    let ssl_mode = match p.ssl_mode.as_str() {
        "disable" => SslMode::Disable,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => bail!("unknown ssl_mode {other}"),
    };
    Ok(PostgresConfig {
        host: p.host,
        port: p.port,
        user: p.user,
        password: p.password,
        database: p.database,
        ssl_mode,
        ssl_root_cert: p.ssl_root_cert,
        publication: p.publication,
        slot: p.slot,
        tables: p.tables,
        snapshot_parallelism: p.snapshot_parallelism,
        replica_identity_full: p.replica_identity_full,
        warn_retained_wal: p.warn_retained_wal,
        table_names: table_names(job),
    })
}

/// The Iceberg table names the job file gives change streams (`schema.table` → name).
fn table_names(job: &JobConfig) -> HashMap<String, String> {
    job.tables
        .iter()
        .filter_map(|t| Some((t.key.clone(), t.name.clone()?)))
        .collect()
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

async fn quickstart(dir: &Path, duration: &str) -> anyhow::Result<()> {
    // The built-in job's defaults, replaced by the flags.
    let text = QUICKSTART
        .replace(
            "${FLOE_QUICKSTART_DIR:-floe-quickstart}",
            &dir.display().to_string(),
        )
        .replace("${FLOE_QUICKSTART_DURATION:-20s}", duration);
    let config = JobConfig::from_toml(
        Some(Path::new("jobs/quickstart.toml")),
        &text,
        &otlp_format(None).streams(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "floe quickstart: generating OpenTelemetry data for {duration} into {}/warehouse",
        dir.display()
    );
    let summary = run(config).await?;
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
        }
    }
    println!(
        "Or serve the catalog and ATTACH it:\n\n  floe-catalog --warehouse {} --store sqlite://{}\n  ATTACH 'floe' AS lake (TYPE iceberg, ENDPOINT 'http://127.0.0.1:8181', AUTHORIZATION_TYPE 'none');\n  SELECT count(*) FROM lake.otel.otel_spans;",
        warehouse.display(),
        absolute(&dir.join("state/catalog.db"))?.display()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if cli.log_json {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .json()
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match cli.command {
        Command::Validate { files } => {
            let mut failed = false;
            for file in &files {
                match load(file) {
                    Ok(_) => println!("{}: ok", file.display()),
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
        Command::Run { job } => match load(&job) {
            Ok(config) => run(config).await.map(|summary| {
                tracing::info!(?summary, "job stopped");
            }),
            Err(errors) => {
                eprintln!("{errors}");
                return ExitCode::from(2);
            }
        },
        Command::Quickstart { dir, duration } => quickstart(&dir, &duration).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floe: {e:#}");
            ExitCode::FAILURE
        }
    }
}
