//! The status page `floe run` serves at `/` beside `/metrics`: the pipeline, the last
//! checkpoints (duration, commit time, rows, the table writer's busy and backpressure shares
//! of the time since the one before, outcome) with a chart, each source partition's
//! committed position, lag and watermarks, the operators' open windows and timers, the state
//! store's size and the latest dead letters with their reasons.
//!
//! It reads what the job already keeps: the Prometheus registry, and a [`JobPage`] the job
//! loop appends to once per checkpoint (and once per dead letter, which is rare) — nothing on
//! the per-record path. Server-rendered HTML with inline SVG, no script, no request to any
//! other host; every text that came from data or configuration is escaped.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floe_process::html::{
    bytes, clock, escape, head, labelled, number, push_latest, seconds, series, status_line, sum,
    table, tiles,
};
use floe_process::now_ms;
use prometheus::proto::MetricFamily;

use floe_core::DeadLetter;

/// Checkpoints and dead letters the page keeps.
const KEEP: usize = 30;

/// What the page shows beyond the metrics; clones share it.
#[derive(Debug, Clone, Default)]
pub struct JobPage(Arc<Mutex<PageState>>);

#[derive(Debug, Default)]
struct PageState {
    job: String,
    pipeline: String,
    started_ms: i64,
    positions: BTreeMap<String, String>,
    checkpoints: VecDeque<CheckpointRow>,
    dead_letters: VecDeque<DeadLetterRow>,
}

/// One checkpoint as the page lists it.
#[derive(Debug, Clone)]
pub struct CheckpointRow {
    /// The checkpoint id (0 for one that never committed).
    pub id: u64,
    /// When it ended (ms since the epoch).
    pub at_ms: i64,
    /// Barrier to committed.
    pub took: Duration,
    /// The catalog commit alone.
    pub commit_took: Duration,
    /// Rows committed, all tables.
    pub rows: u64,
    /// `committed`, or why it was dropped.
    pub outcome: String,
    /// Seconds the table writer had worked since the start, at its end.
    pub writer_busy: f64,
    /// Seconds the loop had waited for the writer since the start, at its end.
    pub writer_backpressure: f64,
}

/// The share of the wall-clock time between checkpoints `before` and `after` that a clock
/// (`writer_busy` or `writer_backpressure`) moved by, in percent.
fn share(
    before: &CheckpointRow,
    after: &CheckpointRow,
    clock: fn(&CheckpointRow) -> f64,
) -> String {
    let wall = (after.at_ms - before.at_ms) as f64 / 1000.0;
    if wall <= 0.0 {
        return String::new();
    }
    let moved = (clock(after) - clock(before)).max(0.0);
    format!("{:.0} %", (moved / wall * 100.0).min(100.0))
}

#[derive(Debug, Clone)]
struct DeadLetterRow {
    at_ms: i64,
    source: String,
    reason: String,
}

impl JobPage {
    fn state(&self) -> std::sync::MutexGuard<'_, PageState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names the job and its pipeline (the tree `floe validate` prints).
    pub fn describe(&self, job: &str, pipeline: &str) {
        let mut s = self.state();
        s.job = job.to_string();
        s.pipeline = pipeline.to_string();
        s.started_ms = now_ms();
    }

    /// A checkpoint ended; `positions` are the committed ones after it (unchanged when it
    /// was dropped).
    pub fn checkpoint(&self, row: CheckpointRow, positions: Option<&BTreeMap<String, String>>) {
        let mut s = self.state();
        if let Some(positions) = positions {
            s.positions = positions.clone();
        }
        push_latest(&mut s.checkpoints, KEEP, row);
    }

    /// A record became a dead letter.
    pub fn dead_letter(&self, letter: &DeadLetter) {
        let source = format!("{}/{}@{}", letter.topic, letter.partition, letter.offset);
        let reason = &letter.reason;
        // A reason quotes the record at most this far.
        let reason: String = reason.chars().take(500).collect();
        let row = DeadLetterRow {
            at_ms: now_ms(),
            source,
            reason,
        };
        push_latest(&mut self.state().dead_letters, KEEP, row);
    }

    /// The page, with the metrics `families` gathered now.
    pub fn render(&self, families: &[MetricFamily], ready: bool) -> String {
        let s = self.state();
        let mut out = String::with_capacity(16 << 10);
        let title = format!("floe run {}", s.job);
        head(&mut out, &title);
        status_line(
            &mut out,
            if ready { "reading" } else { "recovering" },
            s.started_ms,
        );
        let total = |name: &str| sum(families, name);
        // A writer clock's share of the time between the last two checkpoints.
        let latest = |clock: fn(&CheckpointRow) -> f64| {
            let n = s.checkpoints.len();
            if n < 2 {
                return "-".to_string();
            }
            share(&s.checkpoints[n - 2], &s.checkpoints[n - 1], clock)
        };
        tiles(
            &mut out,
            &[
                ("checkpoints", number(total("floe_checkpoints_total"))),
                (
                    "dropped checkpoints",
                    number(total("floe_checkpoints_aborted_total")),
                ),
                ("rows committed", number(total("floe_rows_total"))),
                ("dead letters", number(total("floe_dead_letters_total"))),
                ("state keys", number(total("floe_state_keys"))),
                ("state bytes", bytes(total("floe_state_bytes"))),
                ("writer busy", latest(|c| c.writer_busy)),
                ("backpressure", latest(|c| c.writer_backpressure)),
            ],
        );

        out.push_str("<h2>Pipeline</h2><pre>");
        out.push_str(&escape(&s.pipeline));
        out.push_str("</pre>");

        out.push_str("<h2>Checkpoints</h2>");
        checkpoint_chart(&mut out, &s.checkpoints);
        // Each checkpoint with the one before it: the writer's shares of the time between.
        let pairs: Vec<(Option<&CheckpointRow>, &CheckpointRow)> = s
            .checkpoints
            .iter()
            .enumerate()
            .map(|(i, c)| (i.checked_sub(1).map(|p| &s.checkpoints[p]), c))
            .collect();
        let busy = |c: &CheckpointRow| c.writer_busy;
        let waited = |c: &CheckpointRow| c.writer_backpressure;
        table(
            &mut out,
            &[
                "id",
                "ended",
                "took",
                "commit",
                "rows",
                "writer busy",
                "backpressure",
                "outcome",
            ],
            pairs.iter().rev().map(|(before, c)| {
                vec![
                    c.id.to_string(),
                    clock(c.at_ms),
                    seconds(c.took),
                    seconds(c.commit_took),
                    number(c.rows as f64),
                    before.map(|b| share(b, c, busy)).unwrap_or_default(),
                    before.map(|b| share(b, c, waited)).unwrap_or_default(),
                    c.outcome.clone(),
                ]
            }),
        );

        out.push_str("<h2>Source partitions</h2>");
        let lag = labelled(families, "floe_consumer_lag_records", "partition");
        let mut watermarks: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (labels, value) in series(families, "floe_watermark_lag_milliseconds") {
            let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
            watermarks
                .entry(get("partition"))
                .or_default()
                .push(format!(
                    "{}: {} behind",
                    get("operator"),
                    seconds(Duration::from_millis(value.max(0.0) as u64))
                ));
        }
        let mut partitions: Vec<&String> = s
            .positions
            .keys()
            .filter(|k| !k.contains('#'))
            .chain(lag.keys())
            .chain(watermarks.keys())
            .collect();
        partitions.sort();
        partitions.dedup();
        table(
            &mut out,
            &[
                "partition",
                "committed position",
                "lag (records)",
                "watermarks",
            ],
            partitions.into_iter().map(|p| {
                vec![
                    p.clone(),
                    s.positions.get(p).cloned().unwrap_or_default(),
                    lag.get(p).map(|v| number(*v)).unwrap_or_default(),
                    watermarks.get(p).map(|w| w.join("; ")).unwrap_or_default(),
                ]
            }),
        );

        let open = labelled(families, "floe_open_windows", "operator");
        if !open.is_empty() {
            out.push_str("<h2>Operators</h2>");
            let late = labelled(families, "floe_late_rows", "operator");
            let timers = labelled(families, "floe_timers_pending", "operator");
            table(
                &mut out,
                &["operator", "open windows", "late rows", "timers"],
                open.iter().map(|(op, n)| {
                    vec![
                        op.clone(),
                        number(*n),
                        late.get(op).map(|v| number(*v)).unwrap_or_default(),
                        timers.get(op).map(|v| number(*v)).unwrap_or_default(),
                    ]
                }),
            );
        }

        out.push_str("<h2>Tables</h2>");
        table(
            &mut out,
            &["table", "rows committed"],
            labelled(families, "floe_rows_total", "table")
                .into_iter()
                .map(|(t, n)| vec![t, number(n)]),
        );

        out.push_str("<h2>Latest dead letters</h2>");
        table(
            &mut out,
            &["at", "read from", "reason"],
            s.dead_letters
                .iter()
                .rev()
                .map(|d| vec![clock(d.at_ms), d.source.clone(), d.reason.clone()]),
        );
        out.push_str("</body></html>\n");
        out
    }
}

/// Bars of the checkpoints' durations (commit time darker), oldest left.
fn checkpoint_chart(out: &mut String, checkpoints: &VecDeque<CheckpointRow>) {
    if checkpoints.is_empty() {
        return;
    }
    let (width, height, bar) = (KEEP as f64 * 12.0, 60.0, 10.0);
    let max = checkpoints
        .iter()
        .map(|c| c.took.as_secs_f64())
        .fold(0.001, f64::max);
    let _ = write!(
        out,
        "<svg width=\"{width}\" height=\"{h}\" role=\"img\" aria-label=\"checkpoint durations\">",
        h = height + 14.0
    );
    for (i, c) in checkpoints.iter().enumerate() {
        let x = i as f64 * 12.0;
        let total = c.took.as_secs_f64() / max * height;
        let commit = (c.commit_took.as_secs_f64() / max * height).min(total);
        let color = if c.outcome == "committed" {
            "#7aa6d6"
        } else {
            "#d67a7a"
        };
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{bar}\" height=\"{total:.1}\" fill=\"{color}\">\
             <title>checkpoint {id}: {took}</title></rect>\
             <rect x=\"{x}\" y=\"{cy}\" width=\"{bar}\" height=\"{commit:.1}\" fill=\"#2f5f8f\"/>",
            y = height - total,
            cy = height - commit,
            id = c.id,
            took = seconds(c.took),
        );
    }
    let _ = write!(
        out,
        "<text x=\"0\" y=\"{}\" font-size=\"11\">longest {} · dark: the catalog commit</text></svg>",
        height + 12.0,
        seconds(Duration::from_secs_f64(max))
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_came_from_data_is_escaped_everywhere_it_is_shown() {
        let page = JobPage::default();
        let evil = "<script>alert('x')</script>&\"";
        page.describe(evil, &format!("spans → table {evil}"));
        page.dead_letter(&DeadLetter {
            topic: Arc::from(format!("topic{evil}").as_str()),
            partition: 0,
            offset: 1,
            raw: Vec::new(),
            reason: evil.to_string(),
        });
        page.checkpoint(
            CheckpointRow {
                id: 1,
                at_ms: 0,
                took: Duration::from_millis(1500),
                commit_took: Duration::from_millis(200),
                rows: 1234567,
                outcome: format!("dropped: {evil}"),
                writer_busy: 0.0,
                writer_backpressure: 0.0,
            },
            Some(&BTreeMap::from([(format!("t{evil}/0"), evil.to_string())])),
        );
        let html = page.render(&[], true);
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("alert('x')"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"));
        assert!(html.contains("1,234,567"), "{html}");
        assert!(html.contains("1.5 s"), "{html}");
    }

    #[test]
    fn the_page_keeps_the_latest_checkpoints_and_the_writer_shares_between_them() {
        let page = JobPage::default();
        // Checkpoint `id`, ended at `at_ms`, whose writer has worked half a second and waited a
        // quarter more than at the one before.
        let row = |id: u64, at_ms: i64| CheckpointRow {
            id,
            at_ms,
            took: Duration::from_millis(10),
            commit_took: Duration::from_millis(5),
            rows: 1,
            outcome: "committed".into(),
            writer_busy: id as f64 * 0.5,
            writer_backpressure: id as f64 * 0.25,
        };
        for id in 0..(KEEP as u64 + 5) {
            page.checkpoint(row(id, 0), None);
        }
        {
            let state = page.state();
            assert_eq!(state.checkpoints.len(), KEEP);
            assert_eq!(state.checkpoints.front().unwrap().id, 5);
        }
        // Checkpoints 1 s apart whose writer worked half of it and waited a quarter.
        let spaced = JobPage::default();
        for id in 0..3u64 {
            spaced.checkpoint(row(id, id as i64 * 1000), None);
        }
        let html = spaced.render(&[], true);
        assert!(html.contains("<b>50 %</b>writer busy"), "{html}");
        assert!(html.contains("<b>25 %</b>backpressure"), "{html}");
    }
}
