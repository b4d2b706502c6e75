//! The status page the daemon serves at `/` beside `/metrics` (with `[daemon] metrics_listen`):
//! what it does in all (tiles from its metrics), its schedule — every (table, task) with the
//! cron expression, the next fire and whether it runs now or waits for another daemon's
//! lease — and its latest runs with their outcomes.
//!
//! The scheduler hands the page its entries once per loop (it wakes about once a second) and
//! each run once when it ends; the page renders on request from those and the registry.
//! HTML from [`floe_process::html`]: no script, nothing from another host, data escaped.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use floe_process::html::{
    head, number, push_latest, seconds, series, status_line, sum, table, tiles, utc,
};
use prometheus::proto::MetricFamily;

use crate::state::now_ms;

/// Runs the page keeps.
const KEEP: usize = 50;

/// What the page shows beyond the metrics; clones share it.
#[derive(Debug, Clone, Default)]
pub struct DaemonPage(Arc<Mutex<PageState>>);

#[derive(Debug, Default)]
struct PageState {
    daemon: String,
    started_ms: i64,
    schedule: Vec<ScheduleRow>,
    runs: VecDeque<RunRow>,
}

/// One scheduled task of one table.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    /// `namespace.table`.
    pub table: String,
    /// The task's name.
    pub task: String,
    /// The cron expression, as configured.
    pub schedule: String,
    /// The first fire not yet done.
    pub next: Option<DateTime<Utc>>,
    /// `running`, `waiting for another daemon's lease`, or `scheduled`.
    pub state: &'static str,
}

/// One run as the page lists it.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// `namespace.table`.
    pub table: String,
    /// The task's name.
    pub task: String,
    /// When it started (ms since the epoch).
    pub started_ms: i64,
    /// How long it took.
    pub took: Duration,
    /// Whether it did its work.
    pub ok: bool,
    /// What it did (its report's summary), or why it failed.
    pub detail: String,
}

impl DaemonPage {
    fn state(&self) -> std::sync::MutexGuard<'_, PageState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names the daemon (its name in leases).
    pub fn describe(&self, daemon: &str) {
        let mut s = self.state();
        s.daemon = daemon.to_string();
        s.started_ms = now_ms();
    }

    /// The schedule as it stands now.
    pub fn schedule(&self, rows: Vec<ScheduleRow>) {
        self.state().schedule = rows;
    }

    /// A run ended.
    pub fn run(&self, row: RunRow) {
        push_latest(&mut self.state().runs, KEEP, row);
    }

    /// The page, with the metrics `families` gathered now.
    pub fn render(&self, families: &[MetricFamily], ready: bool) -> String {
        let s = self.state();
        let mut out = String::with_capacity(16 << 10);
        head(&mut out, &format!("floe-maintenance {}", s.daemon));
        status_line(
            &mut out,
            if ready { "scheduling" } else { "starting" },
            s.started_ms,
        );
        // Runs by outcome, summed over the tasks.
        let by_outcome = |outcome: &str| -> f64 {
            series(families, "floe_maintenance_runs_total")
                .into_iter()
                .filter(|(labels, _)| labels.get("outcome").map(String::as_str) == Some(outcome))
                .map(|(_, v)| v)
                .sum()
        };
        let total = |name: &str| sum(families, name);
        tiles(
            &mut out,
            &[
                ("tables", number(total("floe_maintenance_tables"))),
                ("running", number(total("floe_maintenance_running"))),
                ("runs", number(by_outcome("ok"))),
                ("failed runs", number(by_outcome("failed"))),
                ("skipped fires", number(by_outcome("skipped"))),
                (
                    "files rewritten",
                    number(total("floe_maintenance_files_rewritten_total")),
                ),
                (
                    "snapshots expired",
                    number(total("floe_maintenance_snapshots_expired_total")),
                ),
            ],
        );

        out.push_str("<h2>Schedule</h2>");
        table(
            &mut out,
            &["table", "task", "schedule", "next fire (UTC)", "now"],
            s.schedule.iter().map(|r| {
                vec![
                    r.table.clone(),
                    r.task.clone(),
                    r.schedule.clone(),
                    r.next
                        .map(|at| utc(at.timestamp_millis()))
                        .unwrap_or_else(|| "never".to_string()),
                    r.state.to_string(),
                ]
            }),
        );

        out.push_str("<h2>Latest runs</h2>");
        table(
            &mut out,
            &[
                "started (UTC)",
                "table",
                "task",
                "took",
                "outcome",
                "what it did",
            ],
            s.runs.iter().rev().map(|r| {
                vec![
                    utc(r.started_ms),
                    r.table.clone(),
                    r.task.clone(),
                    seconds(r.took),
                    if r.ok { "ok" } else { "failed" }.to_string(),
                    r.detail.clone(),
                ]
            }),
        );
        out.push_str("</body></html>\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_shows_the_schedule_and_the_latest_runs_first() {
        let page = DaemonPage::default();
        page.describe("host-1");
        page.schedule(vec![ScheduleRow {
            table: "otel.<spans>".into(),
            task: "compact".into(),
            schedule: "0 */5 * * * *".into(),
            next: DateTime::from_timestamp(1_800_000_000, 0),
            state: "running",
        }]);
        for i in 0..(KEEP + 2) {
            page.run(RunRow {
                table: "otel.spans".into(),
                task: "expire".into(),
                started_ms: 1_800_000_000_000 + i as i64 * 1000,
                took: Duration::from_millis(1500),
                ok: i % 2 == 0,
                detail: format!("run {i}"),
            });
        }
        let html = page.render(&[], true);
        assert!(html.contains("otel.&lt;spans&gt;"), "{html}");
        assert!(html.contains("2027-01-15 08:00:00"), "{html}");
        let newest = html.find(&format!("run {}", KEEP + 1)).unwrap();
        let older = html.find(&format!("run {}<", KEEP)).unwrap();
        assert!(newest < older, "newest first");
        assert!(!html.contains("run 1<"), "only the latest {KEEP} runs");
    }
}
