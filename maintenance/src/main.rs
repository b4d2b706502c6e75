//! The `floe-maintenance` command: the daemon (`--config FILE`), one task on one table now
//! (`run-once`, under the table's lease like a daemon's run), or what that task would change
//! (`plan`).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use floe_lake::rest::CatalogClient;
use floe_lake::{ErrorKind, LakeError};
use floe_maintenance::config::MaintenanceConfig;
use floe_maintenance::daemon::Daemon;
use floe_maintenance::metrics::DaemonMetrics;
use floe_maintenance::state::{StateTable, daemon_name, now_ms, table_ident};
use floe_maintenance::tasks::{CompactionProgress, Task, run_task};
use tokio_util::sync::CancellationToken;

/// Keeps Floe's Iceberg tables fast: compaction, snapshot expiry, orphan removal, manifest
/// merging — on cron schedules as a daemon, or once.
#[derive(Debug, Parser)]
#[command(name = "floe-maintenance", version)]
struct Cli {
    /// Maintenance config (see maintenance/maintenance.toml); runs the daemon when no
    /// subcommand is given.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Logs as JSON lines.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Option<Command>,
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
    Merge,
}

impl From<TaskName> for Task {
    fn from(t: TaskName) -> Self {
        match t {
            TaskName::Compact => Task::Compact,
            TaskName::Expire => Task::Expire,
            TaskName::Orphans => Task::Orphans,
            TaskName::Manifests => Task::Manifests,
            TaskName::Merge => Task::Merge,
        }
    }
}

/// Redraws a one-line progress bar on stderr.
fn draw_progress(p: &CompactionProgress) {
    const WIDTH: usize = 30;
    let done = p.done.groups_committed + p.done.groups_conflicted;
    let filled = (done * WIDTH).checked_div(p.groups).unwrap_or(WIDTH);
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r[{}{}] {done}/{} partitions, {}/{} MiB, {} files -> {}",
        "#".repeat(filled),
        " ".repeat(WIDTH - filled),
        p.groups,
        p.done.bytes_rewritten >> 20,
        p.bytes >> 20,
        p.done.files_rewritten,
        p.done.files_written,
    );
    if done == p.groups {
        let _ = writeln!(err);
    }
    let _ = err.flush();
}

async fn task_once(config: &MaintenanceConfig, args: &TaskArgs, dry_run: bool) -> ExitCode {
    let Some(table) = table_ident(&args.table) else {
        eprintln!("--table {:?} must look like namespace.table", args.table);
        return ExitCode::from(2);
    };
    let tty = std::io::stderr().is_terminal();
    let task: Task = args.task.into();
    let result = async {
        let client = CatalogClient::connect(config.catalog.clone()).await?;
        let run = |client: CatalogClient| async move {
            run_task(
                &client,
                &table,
                config.policy_for(&args.table),
                task,
                dry_run,
                &|p| {
                    if tty {
                        draw_progress(p);
                    }
                },
            )
            .await
        };
        if dry_run {
            return run(client).await;
        }
        // A change takes the table's lease, like a daemon's run: never two tasks at once.
        let state = StateTable::open(
            client.clone(),
            config.daemon.state_table.clone(),
            daemon_name(),
            config.daemon.lease_ttl,
        )
        .await?;
        if state.acquire(&args.table).await?.is_none() {
            let holder = state
                .read()
                .await?
                .leases
                .get(&args.table)
                .map(|l| l.owner.clone())
                .unwrap_or_default();
            return Err(LakeError::new(
                ErrorKind::Conflict,
                format!(
                    "{} is being maintained by {holder}; try again when it is done",
                    args.table
                ),
            ));
        }
        let started = now_ms();
        let result = tokio::select! {
            r = run(client) => r,
            () = state.hold(&args.table) => Err(LakeError::new(
                ErrorKind::Conflict,
                format!("lost the lease on {} to another daemon; stopped", args.table),
            )),
        };
        let ran = result.is_ok().then(|| (task.to_string(), started));
        state
            .release(&args.table, ran.as_ref().map(|(t, at)| (t.as_str(), *at)))
            .await?;
        result
    }
    .await;
    match result {
        Ok(report) => {
            println!("{}", report.summary);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("floe-maintenance: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn daemon(config: MaintenanceConfig) -> ExitCode {
    let metrics = DaemonMetrics::new();
    let ready = floe_process::Readiness::default();
    if let Some(listen) = &config.daemon.metrics_listen {
        let page: floe_process::Page = {
            let (registry, page, ready) = (
                metrics.registry.clone(),
                metrics.page.clone(),
                ready.clone(),
            );
            std::sync::Arc::new(move || page.render(&registry.gather(), ready.is_ready()))
        };
        match floe_process::serve_metrics(
            metrics.registry.clone(),
            listen,
            ready.clone(),
            Some(page),
        )
        .await
        {
            Ok(addr) => {
                tracing::info!(%addr, "serving the status page, /metrics, /healthz and /readyz")
            }
            Err(error) => {
                eprintln!("floe-maintenance: cannot serve metrics on {listen}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    let daemon = match Daemon::open(config, metrics).await {
        Ok(d) => d,
        Err(error) => {
            eprintln!("floe-maintenance: {error}");
            return ExitCode::FAILURE;
        }
    };
    // The catalog answered and the schedule is set: ready.
    ready.set(true);
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        floe_process::shutdown_signal().await;
        on_signal.cancel();
    });
    match daemon.run(shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("floe-maintenance: {error}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = if cli.command.is_some() {
        "warn"
    } else {
        "info"
    };
    floe_process::init_logs(cli.log_json, default_level);
    let Some(path) = &cli.config else {
        eprintln!("floe-maintenance: --config FILE is required (see maintenance/maintenance.toml)");
        return ExitCode::from(2);
    };
    let config = match MaintenanceConfig::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    match &cli.command {
        None => daemon(config).await,
        Some(Command::RunOnce(args)) => task_once(&config, args, false).await,
        Some(Command::Plan(args)) => task_once(&config, args, true).await,
    }
}
