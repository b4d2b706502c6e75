//! The `floe-maintenance` command: run one maintenance task on one table now (`run-once`), or
//! show what it would change (`plan`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use floe_lake::rest::CatalogClient;
use floe_maintenance::config::MaintenanceConfig;
use floe_maintenance::tasks::{Task, run_task};
use iceberg::{NamespaceIdent, TableIdent};

/// Keeps Floe's Iceberg tables fast: compaction, snapshot expiry, orphan removal, manifest
/// merging.
#[derive(Debug, Parser)]
#[command(name = "floe-maintenance", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one task on one table now.
    RunOnce(TaskArgs),
    /// Show what one task would change on one table, changing nothing.
    Plan(TaskArgs),
}

#[derive(Debug, clap::Args)]
struct TaskArgs {
    /// Maintenance config (see maintenance/maintenance.toml).
    #[arg(long)]
    config: PathBuf,
    /// The table, `namespace.table` (nested namespaces: `a.b.table`).
    #[arg(long)]
    table: String,
    /// The task.
    #[arg(long, value_enum)]
    task: TaskName,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TaskName {
    Compact,
    Expire,
    Orphans,
    Manifests,
}

impl From<TaskName> for Task {
    fn from(t: TaskName) -> Self {
        match t {
            TaskName::Compact => Task::Compact,
            TaskName::Expire => Task::Expire,
            TaskName::Orphans => Task::Orphans,
            TaskName::Manifests => Task::Manifests,
        }
    }
}

fn table_ident(name: &str) -> Option<TableIdent> {
    let (namespace, table) = name.rsplit_once('.')?;
    if namespace.is_empty() || table.is_empty() {
        return None;
    }
    let namespace = NamespaceIdent::from_strs(namespace.split('.')).ok()?;
    Some(TableIdent::new(namespace, table.to_string()))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let (args, dry_run) = match &cli.command {
        Command::RunOnce(args) => (args, false),
        Command::Plan(args) => (args, true),
    };
    let config = match MaintenanceConfig::load(&args.config) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    let Some(table) = table_ident(&args.table) else {
        eprintln!("--table {:?} must look like namespace.table", args.table);
        return ExitCode::from(2);
    };
    let result = async {
        let client = CatalogClient::connect(config.catalog.clone()).await?;
        run_task(
            &client,
            &table,
            config.policy_for(&args.table),
            args.task.into(),
            dry_run,
        )
        .await
    }
    .await;
    match result {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("floe-maintenance: {error}");
            ExitCode::FAILURE
        }
    }
}
