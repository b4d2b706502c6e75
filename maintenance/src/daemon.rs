//! The daemon: runs every scheduled task of every table the policies match, on its cron
//! schedule, until SIGTERM.
//!
//! The rules:
//! * **on time** — each (table, task) fires at the times of its cron schedule; the loop wakes
//!   at the next fire time (and at least every second);
//! * **catch up once** — fires missed while no daemon ran (known from the last run recorded in
//!   the [state table](crate::state)) or while the table was busy collapse into one run;
//! * **no overlap** — a fire that comes while the same task is still running on the table is
//!   skipped (counted as `skipped`); at most one task runs per table, so another task due on a
//!   busy table waits for it; at most `concurrency` tasks run at once;
//! * **one daemon per table** — a run first takes the table's lease in the state table; a
//!   table leased by another daemon is retried a few seconds later, and a fire that daemon
//!   already ran is not run again. The lease is renewed while the task runs; if it is lost
//!   anyway, the task is cancelled (the table stays correct: every change is a validated
//!   commit);
//! * **graceful shutdown** — on SIGTERM no new run starts; running ones get `shutdown_grace`
//!   to finish, then are cancelled and their leases given back.
//!
//! Tables are found by listing the catalog every `discover_every`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use floe_lake::LakeResult;
use floe_lake::rest::CatalogClient;
use iceberg::TableIdent;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{MaintenanceConfig, Policy};
use crate::metrics::DaemonMetrics;
use crate::page::{RunRow, ScheduleRow};
use crate::state::{StateTable, now_ms, table_name};
use crate::tasks::{Task, run_task};

/// How long to wait before asking again for a table another daemon holds.
const BUSY_RETRY: Duration = Duration::from_secs(5);
/// Trim the state table after this many runs.
const TRIM_EVERY: u64 = 25;
/// Snapshots of the state table kept by a trim.
const STATE_SNAPSHOTS_KEPT: usize = 20;

/// One scheduled task of one table.
#[derive(Debug)]
struct Entry {
    ident: TableIdent,
    schedule: cron::Schedule,
    /// Fires up to this instant are done (run, skipped or collapsed into a run).
    done_until: DateTime<Utc>,
    /// Do not try before this (the table was leased by another daemon).
    not_before: Option<Instant>,
}

impl Entry {
    /// The first fire not yet done.
    fn next_fire(&self) -> Option<DateTime<Utc>> {
        self.schedule.after(&self.done_until).next()
    }
}

/// How one run ended.
#[derive(Debug)]
enum Outcome {
    Ran,
    Failed,
    /// Another daemon holds the table.
    Busy,
    /// Another daemon already ran this fire.
    AlreadyRan,
}

/// The daemon.
#[derive(Debug)]
pub struct Daemon {
    config: MaintenanceConfig,
    client: CatalogClient,
    state: StateTable,
    metrics: DaemonMetrics,
}

fn ms_to_utc(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_else(Utc::now)
}

impl Daemon {
    /// Connects to the catalog and opens (or creates) the state table.
    pub async fn open(config: MaintenanceConfig, metrics: DaemonMetrics) -> LakeResult<Self> {
        let client = CatalogClient::connect(config.catalog.clone()).await?;
        let state = StateTable::open(
            client.clone(),
            config.daemon.state_table.clone(),
            crate::state::daemon_name(),
            config.daemon.lease_ttl,
        )
        .await?;
        Ok(Self {
            config,
            client,
            state,
            metrics,
        })
    }

    /// This daemon's name in leases.
    pub fn name(&self) -> &str {
        self.state.owner()
    }

    /// Lists the catalog and brings `entries` up to date: new tables get their policy's tasks
    /// (starting after their last recorded run, or now), vanished tables are dropped.
    async fn discover(&self, entries: &mut BTreeMap<(String, Task), Entry>) -> LakeResult<()> {
        let state = self.state.read().await?;
        let state_table = table_name(self.state.ident());
        let mut seen = Vec::new();
        for namespace in self.client.list_namespaces().await? {
            for ident in self.client.list_tables(&namespace).await? {
                let name = table_name(&ident);
                if name == state_table {
                    continue;
                }
                let Some(policy) = self.config.policy_for(&name) else {
                    continue;
                };
                seen.push(name.clone());
                for (task, schedule) in schedules(policy) {
                    entries.entry((name.clone(), task)).or_insert_with(|| {
                        let done_until = state
                            .last_runs
                            .get(&(name.clone(), task.to_string()))
                            .map(|ms| ms_to_utc(*ms))
                            .unwrap_or_else(Utc::now);
                        Entry {
                            ident: ident.clone(),
                            schedule: schedule.clone(),
                            done_until,
                            not_before: None,
                        }
                    });
                }
            }
        }
        entries.retain(|(name, _), _| seen.contains(name));
        self.metrics.tables.set(seen.len() as i64);
        Ok(())
    }

    /// Runs until `shutdown` is cancelled, then lets running tasks finish (up to the grace
    /// period).
    pub async fn run(self, shutdown: CancellationToken) -> LakeResult<()> {
        let this = Arc::new(self);
        let settings = this.config.daemon.clone();
        let mut entries: BTreeMap<(String, Task), Entry> = BTreeMap::new();
        // Table → the task running on it.
        let mut running: HashMap<String, Task> = HashMap::new();
        let mut joins: JoinSet<(String, Task, DateTime<Utc>, Outcome)> = JoinSet::new();
        let mut next_discovery = Instant::now();
        let mut finished_runs = 0u64;
        tracing::info!(daemon = this.name(), "maintenance daemon started");
        this.metrics.page.describe(this.name());
        while !shutdown.is_cancelled() {
            if Instant::now() >= next_discovery {
                if let Err(error) = this.discover(&mut entries).await {
                    tracing::warn!(%error, "could not list the catalog's tables");
                }
                next_discovery = Instant::now() + settings.discover_every;
            }
            let tick = tick(
                &mut entries,
                &running,
                settings.concurrency,
                Utc::now(),
                Instant::now(),
            );
            for (name, task, fires) in tick.skipped {
                tracing::info!(table = %name, %task, fires, "still running at its next fire; skipped");
                this.metrics.skip(task, fires);
            }
            for run in tick.launch {
                running.insert(run.name.clone(), run.task);
                let this = this.clone();
                joins.spawn(async move {
                    let outcome = this
                        .run_one(&run.name, &run.ident, run.task, run.latest)
                        .await;
                    if matches!(outcome, Outcome::Ran | Outcome::Failed) && run.collapsed > 0 {
                        tracing::info!(
                            table = %run.name,
                            task = %run.task,
                            fires = run.collapsed,
                            "missed fires (no daemon running, or the table busy) caught up once"
                        );
                        this.metrics.skip(run.task, run.collapsed);
                    }
                    (run.name, run.task, run.previous, outcome)
                });
            }
            this.metrics
                .page
                .schedule(schedule_rows(&entries, &running, Instant::now()));
            let wake = tick.wake;
            let wait = (wake - Utc::now())
                .to_std()
                .unwrap_or_default()
                .max(Duration::from_millis(10));
            tokio::select! {
                Some(joined) = joins.join_next() => {
                    let Ok((name, task, previous, outcome)) = joined else {
                        continue;
                    };
                    running.remove(&name);
                    if let Outcome::Busy = outcome
                        && let Some(entry) = entries.get_mut(&(name.clone(), task))
                    {
                        // Not run: due again once the other daemon may be done.
                        entry.done_until = previous;
                        entry.not_before = Some(Instant::now() + BUSY_RETRY);
                    }
                    finished_runs += 1;
                    if finished_runs.is_multiple_of(TRIM_EVERY)
                        && let Err(error) = this.state.trim(STATE_SNAPSHOTS_KEPT).await
                    {
                        tracing::warn!(%error, "could not trim the state table");
                    }
                }
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => {}
            }
        }
        tracing::info!(
            running = running.len(),
            "stopping: no new runs; waiting for running ones"
        );
        let drained = tokio::time::timeout(settings.shutdown_grace, async {
            while joins.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                tables = ?running.keys().collect::<Vec<_>>(),
                "running tasks did not finish within the grace period; cancelling them"
            );
            joins.abort_all();
            while joins.join_next().await.is_some() {}
            for name in running.keys() {
                if let Err(error) = this.state.release(name, None).await {
                    tracing::warn!(table = %name, %error, "could not give back the lease");
                }
            }
        }
        tracing::info!("maintenance daemon stopped");
        Ok(())
    }

    /// One run of `task` on `name`, for the fires up to `fire`: lease, run (renewing),
    /// release.
    async fn run_one(
        &self,
        name: &str,
        ident: &TableIdent,
        task: Task,
        fire: DateTime<Utc>,
    ) -> Outcome {
        let task_name = task.to_string();
        let state = match self.state.acquire(name).await {
            Ok(Some(state)) => state,
            Ok(None) => {
                tracing::debug!(table = %name, %task, "leased by another daemon; retrying later");
                return Outcome::Busy;
            }
            Err(error) => {
                tracing::warn!(table = %name, %task, %error, "could not take the lease");
                self.metrics
                    .runs
                    .with_label_values(&[&task_name, "failed"])
                    .inc();
                return Outcome::Failed;
            }
        };
        if state
            .last_runs
            .get(&(name.to_string(), task_name.clone()))
            .is_some_and(|at| *at >= fire.timestamp_millis())
        {
            tracing::debug!(table = %name, %task, "another daemon ran this fire");
            if let Err(error) = self.state.release(name, None).await {
                tracing::warn!(table = %name, %error, "could not give back the lease");
            }
            return Outcome::AlreadyRan;
        }
        let started_ms = now_ms();
        let started = Instant::now();
        self.metrics.running.inc();
        tracing::info!(table = %name, %task, "run started");
        let policy = self.config.policy_for(name);
        let result = tokio::select! {
            r = run_task(&self.client, ident, policy, task, false, &|_| {}) => Some(r),
            () = self.state.hold(name) => None,
        };
        self.metrics.running.dec();
        let seconds = started.elapsed().as_secs_f64();
        let page_row = |ok: bool, detail: String| RunRow {
            table: name.to_string(),
            task: task_name.clone(),
            started_ms,
            took: started.elapsed(),
            ok,
            detail,
        };
        let outcome = match result {
            Some(Ok(report)) => {
                tracing::info!(table = %name, %task, seconds, "{}", report.summary);
                self.metrics.record(name, &task_name, &report, seconds);
                self.metrics
                    .page
                    .run(page_row(true, report.summary.clone()));
                Outcome::Ran
            }
            Some(Err(error)) => {
                tracing::warn!(table = %name, %task, seconds, %error, "run failed");
                self.metrics
                    .runs
                    .with_label_values(&[&task_name, "failed"])
                    .inc();
                self.metrics.page.run(page_row(false, error.to_string()));
                Outcome::Failed
            }
            None => {
                tracing::warn!(table = %name, %task, "lease lost to another daemon; run cancelled");
                self.metrics
                    .runs
                    .with_label_values(&[&task_name, "failed"])
                    .inc();
                self.metrics.page.run(page_row(
                    false,
                    "cancelled: the lease was lost to another daemon".to_string(),
                ));
                return Outcome::Failed;
            }
        };
        if let Err(error) = self
            .state
            .release(name, Some((&task_name, started_ms)))
            .await
        {
            tracing::warn!(table = %name, %error, "could not record the run and give back the lease");
        }
        outcome
    }
}

/// A run to start now.
#[derive(Debug)]
struct Launch {
    name: String,
    task: Task,
    ident: TableIdent,
    /// The latest fire it covers (all due fires collapse into it).
    latest: DateTime<Utc>,
    /// How many earlier fires collapse into it.
    collapsed: usize,
    /// The entry's `done_until` before, restored if the run does not happen.
    previous: DateTime<Utc>,
}

/// What the scheduler does at one instant.
#[derive(Debug)]
struct Tick {
    launch: Vec<Launch>,
    /// Fires that came while the same task was still running on the table: (table, task,
    /// count).
    skipped: Vec<(String, Task, usize)>,
    /// When to look again at the latest.
    wake: DateTime<Utc>,
}

/// The scheduling rules at `now`, given what is `running`: due entries start unless their
/// table is busy or `concurrency` is reached; a fire during a run of the same task is skipped;
/// all fires up to `now` collapse into one run.
fn tick(
    entries: &mut BTreeMap<(String, Task), Entry>,
    running: &HashMap<String, Task>,
    concurrency: usize,
    now: DateTime<Utc>,
    instant: Instant,
) -> Tick {
    let mut out = Tick {
        launch: Vec::new(),
        skipped: Vec::new(),
        wake: now + chrono::Duration::seconds(1),
    };
    // Due entries, the longest-waiting first (so a busy table's other tasks are not starved).
    let mut due = Vec::new();
    for (key, entry) in entries.iter() {
        match entry.next_fire() {
            Some(fire) if fire <= now => due.push((fire, key.clone())),
            Some(fire) => out.wake = out.wake.min(fire),
            None => {}
        }
    }
    due.sort();
    for (fire, key) in due {
        let (name, task) = &key;
        let Some(entry) = entries.get_mut(&key) else {
            continue;
        };
        if running.get(name) == Some(task) {
            let fires = fires_until(entry, now);
            out.skipped.push((name.clone(), *task, fires));
            entry.done_until = now;
            continue;
        }
        let busy = running.contains_key(name) || out.launch.iter().any(|l| &l.name == name);
        if busy
            || running.len() + out.launch.len() >= concurrency
            || entry.not_before.is_some_and(|t| t > instant)
        {
            continue;
        }
        // The run covers every fire up to now; another daemon's run after the latest of them
        // makes this one unnecessary.
        let latest = entry
            .schedule
            .after(&(now + chrono::Duration::milliseconds(1)))
            .next_back()
            .filter(|l| *l >= fire)
            .unwrap_or(fire);
        out.launch.push(Launch {
            name: name.clone(),
            task: *task,
            ident: entry.ident.clone(),
            latest,
            collapsed: fires_until(entry, now).saturating_sub(1),
            previous: entry.done_until,
        });
        entry.done_until = now;
        entry.not_before = None;
    }
    out
}

/// The schedule as the status page shows it.
fn schedule_rows(
    entries: &BTreeMap<(String, Task), Entry>,
    running: &HashMap<String, Task>,
    instant: Instant,
) -> Vec<ScheduleRow> {
    entries
        .iter()
        .map(|((name, task), entry)| ScheduleRow {
            table: name.clone(),
            task: task.to_string(),
            schedule: entry.schedule.source().to_string(),
            next: entry.next_fire(),
            state: if running.get(name) == Some(task) {
                "running"
            } else if entry.not_before.is_some_and(|t| t > instant) {
                "waiting for another daemon's lease"
            } else {
                "scheduled"
            },
        })
        .collect()
}

/// How many fires of `entry` are due at `now` (counted up to a bound).
fn fires_until(entry: &Entry, now: DateTime<Utc>) -> usize {
    entry
        .schedule
        .after(&entry.done_until)
        .take(100_000)
        .take_while(|f| *f <= now)
        .count()
}

/// The scheduled tasks of a policy.
fn schedules(policy: &Policy) -> Vec<(Task, &cron::Schedule)> {
    let mut out = Vec::new();
    if let Some(s) = &policy.compact {
        out.push((Task::Compact, &s.schedule));
    }
    if let Some(s) = &policy.expire {
        out.push((Task::Expire, &s.schedule));
    }
    if let Some(s) = &policy.orphans {
        out.push((Task::Orphans, &s.schedule));
    }
    if let Some(s) = &policy.manifests {
        out.push((Task::Manifests, &s.schedule));
    }
    if let Some(s) = &policy.merge {
        out.push((Task::Merge, s));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        ms_to_utc(1_800_000_000_000 + seconds * 1000)
    }

    fn entry(schedule: &str, done_until: i64) -> Entry {
        Entry {
            ident: TableIdent::from_strs(["ns", "t"]).unwrap(),
            schedule: cron::Schedule::from_str(schedule).unwrap(),
            done_until: at(done_until),
            not_before: None,
        }
    }

    fn names(tick: &Tick) -> Vec<(String, Task)> {
        tick.launch
            .iter()
            .map(|l| (l.name.clone(), l.task))
            .collect()
    }

    #[test]
    fn a_fire_runs_on_time_and_missed_fires_collapse_into_one_run() {
        // Every 2 seconds; the clock starts on an even second.
        let mut entries = BTreeMap::from([(
            ("ns.t".to_string(), Task::Compact),
            entry("*/2 * * * * *", 0),
        )]);
        let running = HashMap::new();
        let t = tick(&mut entries, &running, 2, at(1), Instant::now());
        assert!(t.launch.is_empty());
        assert_eq!(t.wake, at(2), "wakes at the next fire");
        let t = tick(&mut entries, &running, 2, at(2), Instant::now());
        assert_eq!(names(&t), [("ns.t".to_string(), Task::Compact)]);
        assert_eq!(t.launch[0].latest, at(2));
        // Down for 20 s: ten missed fires, one run, for the latest of them.
        let t = tick(&mut entries, &running, 2, at(22), Instant::now());
        assert_eq!(t.launch.len(), 1);
        assert_eq!(t.launch[0].latest, at(22));
        assert_eq!(
            t.launch[0].collapsed, 9,
            "nine fires collapse into the run for the tenth"
        );
        let t = tick(&mut entries, &running, 2, at(23), Instant::now());
        assert!(t.launch.is_empty(), "the missed fires are caught up once");
    }

    #[test]
    fn overlapping_fires_are_skipped_and_a_busy_table_waits() {
        let mut entries = BTreeMap::from([
            (("ns.t".to_string(), Task::Compact), entry("* * * * * *", 0)),
            (("ns.t".to_string(), Task::Expire), entry("* * * * * *", 0)),
        ]);
        let running = HashMap::from([("ns.t".to_string(), Task::Compact)]);
        let t = tick(&mut entries, &running, 4, at(3), Instant::now());
        assert_eq!(t.skipped.len(), 1);
        assert_eq!(
            (t.skipped[0].0.as_str(), t.skipped[0].1, t.skipped[0].2),
            ("ns.t", Task::Compact, 3),
            "fires 1, 2 and 3 came while compaction ran"
        );
        assert!(
            t.launch.is_empty(),
            "expire waits for compaction on the same table"
        );
        let t = tick(&mut entries, &running, 4, at(3), Instant::now());
        assert!(t.skipped.is_empty(), "a fire is skipped once");
        // Compaction is done: expire, due since second 1, goes before compaction's fire at 4.
        let t = tick(&mut entries, &HashMap::new(), 4, at(4), Instant::now());
        assert_eq!(names(&t), [("ns.t".to_string(), Task::Expire)]);
        assert_eq!(t.launch[0].latest, at(4));
        assert_eq!(
            t.launch[0].collapsed, 3,
            "expire's fires 1-3 collapse into the run for 4"
        );
    }

    #[test]
    fn concurrency_bounds_the_runs_across_tables() {
        let mut entries = BTreeMap::new();
        for table in ["ns.a", "ns.b", "ns.c"] {
            entries.insert((table.to_string(), Task::Compact), entry("* * * * * *", 0));
        }
        let t = tick(&mut entries, &HashMap::new(), 2, at(1), Instant::now());
        assert_eq!(t.launch.len(), 2);
        let running: HashMap<String, Task> =
            t.launch.iter().map(|l| (l.name.clone(), l.task)).collect();
        let t = tick(&mut entries, &running, 2, at(1), Instant::now());
        assert!(t.launch.is_empty());
        let t = tick(&mut entries, &HashMap::new(), 2, at(1), Instant::now());
        assert_eq!(names(&t), [("ns.c".to_string(), Task::Compact)]);
    }
}
