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
use floe_cdc::postgres::PostgresSource;
use floe_kafka::KafkaSource;
use floe_lake::rest::{CatalogClient, CatalogSettings};
use floe_otlp::{GeneratorSource, OtlpFormat};
use floe_runtime::{Job, JobConfig, JobMetrics, RecordReader, RunSummary};
use source::{KafkaFormat, RawSource, SourceConfig};
use tokio_util::sync::CancellationToken;

mod source;

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

fn load(path: &Path) -> Result<(JobConfig, SourceConfig), floe_config::ConfigErrors> {
    JobConfig::load::<RawSource>(path)
}

/// Runs a validated job; returns what it did and, for an embedded catalog, its warehouse.
async fn run(config: JobConfig, source: SourceConfig) -> anyhow::Result<RunSummary> {
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
    let bytes = Some(metrics.bytes.clone());
    let summary = match source {
        SourceConfig::Kafka(settings, format) => {
            let kafka = KafkaSource::connect(&settings)?;
            match format {
                KafkaFormat::DebeziumJson => {
                    let reader = RecordReader::new(kafka, source::debezium(&config), bytes);
                    Job::open(config, client, reader, metrics)
                        .await?
                        .run(shutdown)
                        .await?
                }
                KafkaFormat::Otlp(signals) => {
                    let reader = RecordReader::new(kafka, OtlpFormat::new(signals), bytes);
                    Job::open(config, client, reader, metrics)
                        .await?
                        .run(shutdown)
                        .await?
                }
            }
        }
        SourceConfig::Generator(g) => {
            let generator = GeneratorSource::new(g.seed, g.requests_per_second, g.duration);
            let reader = RecordReader::new(generator, OtlpFormat::new(HashMap::new()), bytes);
            Job::open(config, client, reader, metrics)
                .await?
                .run(shutdown)
                .await?
        }
        SourceConfig::Postgres(mut p) => {
            p.table_names = source::table_names(&config);
            let reader = PostgresSource::connect(p).await?;
            Job::open(config, client, reader, metrics)
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
    let (config, source) =
        JobConfig::from_toml::<RawSource>(Some(Path::new("jobs/quickstart.toml")), &text)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "floe quickstart: generating OpenTelemetry data for {duration} into {}/warehouse",
        dir.display()
    );
    let summary = run(config, source).await?;
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
    floe_process::init_logs(cli.log_json, "info");
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
            Ok((config, source)) => run(config, source).await.map(|summary| {
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
