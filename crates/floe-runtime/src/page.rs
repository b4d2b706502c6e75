//! The status page `floe run` serves at `/` beside `/metrics`: the pipeline, the last
//! checkpoints (duration, commit time, rows, outcome) with a chart, each source partition's
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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::proto::{MetricFamily, MetricType};

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
}

#[derive(Debug, Clone)]
struct DeadLetterRow {
    at_ms: i64,
    source: String,
    reason: String,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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
        if s.checkpoints.len() == KEEP {
            s.checkpoints.pop_front();
        }
        s.checkpoints.push_back(row);
    }

    /// A record became a dead letter.
    pub fn dead_letter(&self, letter: &DeadLetter) {
        let source = format!("{}/{}@{}", letter.topic, letter.partition, letter.offset);
        let reason = &letter.reason;
        let mut s = self.state();
        if s.dead_letters.len() == KEEP {
            s.dead_letters.pop_front();
        }
        // A reason quotes the record at most this far.
        let reason: String = reason.chars().take(500).collect();
        s.dead_letters.push_back(DeadLetterRow {
            at_ms: now_ms(),
            source,
            reason,
        });
    }

    /// The page, with the metrics `families` gathered now.
    pub fn render(&self, families: &[MetricFamily], ready: bool) -> String {
        let s = self.state();
        let mut out = String::with_capacity(16 << 10);
        let title = format!("floe run {}", s.job);
        head(&mut out, &title);
        let _ = write!(
            out,
            "<p>{} · up {} · <a href=\"/metrics\">/metrics</a></p>",
            if ready { "reading" } else { "recovering" },
            seconds(Duration::from_millis(
                (now_ms() - s.started_ms).max(0) as u64
            )),
        );
        let total = |name: &str| sum(families, name);
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
            ],
        );

        out.push_str("<h2>Pipeline</h2><pre>");
        out.push_str(&escape(&s.pipeline));
        out.push_str("</pre>");

        out.push_str("<h2>Checkpoints</h2>");
        checkpoint_chart(&mut out, &s.checkpoints);
        table(
            &mut out,
            &["id", "ended", "took", "commit", "rows", "outcome"],
            s.checkpoints.iter().rev().map(|c| {
                vec![
                    c.id.to_string(),
                    clock(c.at_ms),
                    seconds(c.took),
                    seconds(c.commit_took),
                    number(c.rows as f64),
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

/// `&`, `<`, `>`, `"` and `'` as entities: text from data never becomes markup.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The document head: refreshes itself every 5 s; styles inline.
fn head(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"5\"><title>{t}</title><style>\
         body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}}\
         table{{border-collapse:collapse;margin:.5em 0}}\
         td,th{{border-bottom:1px solid #ddd;padding:.2em .8em;text-align:left;vertical-align:top}}\
         td.n{{text-align:right;font-variant-numeric:tabular-nums}}\
         pre{{background:#f6f6f6;padding:.6em;overflow:auto}}\
         .tiles{{display:flex;gap:1em;flex-wrap:wrap}}\
         .tile{{border:1px solid #ddd;border-radius:4px;padding:.4em .8em}}\
         .tile b{{display:block;font-size:1.4em}}</style></head><body><h1>{t}</h1>",
        t = escape(title)
    );
}

fn tiles(out: &mut String, items: &[(&str, String)]) {
    out.push_str("<div class=\"tiles\">");
    for (name, value) in items {
        let _ = write!(
            out,
            "<div class=\"tile\"><b>{}</b>{}</div>",
            escape(value),
            escape(name)
        );
    }
    out.push_str("</div>");
}

/// A table; cells that are numbers align right.
fn table(out: &mut String, header: &[&str], rows: impl Iterator<Item = Vec<String>>) {
    out.push_str("<table><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr>");
    let mut any = false;
    for row in rows {
        any = true;
        out.push_str("<tr>");
        for cell in row {
            let numeric = !cell.is_empty()
                && cell
                    .chars()
                    .all(|c| c.is_ascii_digit() || ",. smKMGiB".contains(c));
            let class = if numeric { " class=\"n\"" } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", escape(&cell));
        }
        out.push_str("</tr>");
    }
    if !any {
        let _ = write!(
            out,
            "<tr><td colspan=\"{}\">none yet</td></tr>",
            header.len()
        );
    }
    out.push_str("</table>");
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

/// Every sample of metric `name`: its labels and value.
fn series(families: &[MetricFamily], name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    families
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter().map(move |m| (f.get_field_type(), m)))
        .map(|(kind, m)| {
            let labels = m
                .get_label()
                .iter()
                .map(|l| (l.name().to_string(), l.value().to_string()))
                .collect();
            let value = match kind {
                MetricType::COUNTER => m.get_counter().get_value(),
                _ => m.get_gauge().get_value(),
            };
            (labels, value)
        })
        .collect()
}

/// Metric `name` by the value of its label `label`.
fn labelled(families: &[MetricFamily], name: &str, label: &str) -> BTreeMap<String, f64> {
    series(families, name)
        .into_iter()
        .map(|(labels, v)| (labels.get(label).cloned().unwrap_or_default(), v))
        .collect()
}

/// The sum of metric `name` over its samples.
fn sum(families: &[MetricFamily], name: &str) -> f64 {
    series(families, name).into_iter().map(|(_, v)| v).sum()
}

fn number(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn bytes(v: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = v.max(0.0);
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", units[unit])
    }
}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{:.0} m", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// A UTC time of day, `HH:MM:SS`.
fn clock(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
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
    fn the_page_keeps_the_latest_checkpoints_only() {
        let page = JobPage::default();
        for id in 0..(KEEP as u64 + 5) {
            let row = CheckpointRow {
                id,
                at_ms: 0,
                took: Duration::from_millis(10),
                commit_took: Duration::from_millis(5),
                rows: 1,
                outcome: "committed".into(),
            };
            page.checkpoint(row, None);
        }
        let state = page.state();
        assert_eq!(state.checkpoints.len(), KEEP);
        assert_eq!(state.checkpoints.front().unwrap().id, 5);
    }

    #[test]
    fn numbers_read_like_numbers() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(1234.4), "1,234");
        assert_eq!(number(-1_000_000.0), "-1,000,000");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(seconds(Duration::from_millis(250)), "250 ms");
        assert_eq!(clock(3_723_000), "01:02:03");
    }
}
