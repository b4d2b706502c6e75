//! The `floe-catalog` command: runs the Iceberg REST catalog server until SIGINT or SIGTERM.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use floe_catalog::config::{CatalogConfig, Overrides};

/// An Iceberg REST catalog on SQLite or Postgres, with a local or S3 warehouse.
#[derive(Debug, Parser)]
#[command(name = "floe-catalog", version)]
struct Cli {
    /// TOML settings file (see catalog/catalog.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8181].
    #[arg(long)]
    listen: Option<String>,
    /// Warehouse root: file:///path, an absolute path, or s3://bucket/prefix [default: ./warehouse].
    #[arg(long)]
    warehouse: Option<String>,
    /// Pointer store: sqlite:///path/catalog.db or postgres://user@host/db [default: sqlite://catalog.db].
    #[arg(long)]
    store: Option<String>,
    /// Catalog name: the REST prefix and the JDBC catalog_name [default: floe].
    #[arg(long)]
    name: Option<String>,
    /// Serve without authentication on a non-loopback address.
    #[arg(long)]
    allow_anonymous: bool,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "FLOE_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    floe_process::init_logs(cli.log_json, "info");
    let overrides = Overrides {
        name: cli.name,
        listen: cli.listen,
        warehouse: cli.warehouse,
        store: cli.store,
        allow_anonymous: cli.allow_anonymous,
    };
    let config = match CatalogConfig::load(cli.config.as_deref(), &overrides) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            std::process::exit(2);
        }
    };
    let running = floe_catalog::start(&config)
        .await
        .context("floe-catalog could not start")?;
    tracing::info!(
        uri = %running.uri(),
        prefix = %config.name,
        warehouse = %config.warehouse,
        store = ?config.store,
        auth = config.auth.enabled(),
        "catalog listening"
    );
    floe_process::shutdown_signal().await;
    tracing::info!("shutting down");
    running.stop().await.context("server failed")?;
    Ok(())
}
