//! Server-rendered HTML for the binaries' status pages: one look, no script, no request to
//! any other host (no CDN, no web font), every text that came from data or configuration
//! escaped. Helpers append to a `String`; the readings of a Prometheus registry come from
//! [`series`], [`labelled`] and [`sum`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use prometheus::proto::{MetricFamily, MetricType};

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

/// The document head: refreshes itself every 5 s; styles inline; an empty icon, so the
/// browser asks for no `/favicon.ico` either.
pub fn head(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"5\"><link rel=\"icon\" href=\"data:,\"><title>{t}</title><style>\
         body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}}\
         table{{border-collapse:collapse;margin:.5em 0}}\
         td,th{{border-bottom:1px solid #ddd;padding:.2em .8em;text-align:left;vertical-align:top}}\
         td.n{{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}}\
         pre{{background:#f6f6f6;padding:.6em;overflow:auto}}\
         .tiles{{display:flex;gap:1em;flex-wrap:wrap}}\
         .tile{{border:1px solid #ddd;border-radius:4px;padding:.4em .8em}}\
         .tile b{{display:block;font-size:1.4em}}</style></head><body><h1>{t}</h1>",
        t = escape(title)
    );
}

/// The line under a page's title: what the process does now, how long it has been up (from
/// `started_ms`, ms since the epoch) and the link to its metrics.
pub fn status_line(out: &mut String, doing: &str, started_ms: i64) {
    let _ = write!(
        out,
        "<p>{} · up {} · <a href=\"/metrics\">/metrics</a></p>",
        escape(doing),
        seconds(Duration::from_millis(
            (crate::now_ms() - started_ms).max(0) as u64
        )),
    );
}

/// Appends `item` to the latest `keep` a page lists, dropping the oldest when full.
pub fn push_latest<T>(latest: &mut std::collections::VecDeque<T>, keep: usize, item: T) {
    if latest.len() == keep {
        latest.pop_front();
    }
    latest.push_back(item);
}

/// Headline numbers, each a value over its name.
pub fn tiles(out: &mut String, items: &[(&str, String)]) {
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

/// A table cell: text, or a link to another page of the same server.
#[derive(Debug, Clone)]
pub enum Cell {
    /// Shown as it is (escaped); right-aligned when it reads as a number.
    Text(String),
    /// `text` linking to `href` (both escaped).
    Link {
        /// The path, e.g. `/tables/otel/otel_spans`.
        href: String,
        /// What the link says.
        text: String,
    },
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Cell::Text(text)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Cell::Text(text.to_string())
    }
}

/// A link cell.
pub fn link(href: impl Into<String>, text: impl Into<String>) -> Cell {
    Cell::Link {
        href: href.into(),
        text: text.into(),
    }
}

/// A table; cells that are numbers align right, and an empty table says "none yet".
pub fn table<C: Into<Cell>>(out: &mut String, header: &[&str], rows: impl Iterator<Item = Vec<C>>) {
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
            match cell.into() {
                Cell::Text(text) => {
                    let numeric = !text.is_empty()
                        && text
                            .chars()
                            .all(|c| c.is_ascii_digit() || ",. smhKMGiB%".contains(c));
                    let class = if numeric { " class=\"n\"" } else { "" };
                    let _ = write!(out, "<td{class}>{}</td>", escape(&text));
                }
                Cell::Link { href, text } => {
                    let _ = write!(
                        out,
                        "<td><a href=\"{}\">{}</a></td>",
                        escape(&href),
                        escape(&text)
                    );
                }
            }
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

/// Every sample of metric `name`: its labels and value (a histogram's: its count).
pub fn series(families: &[MetricFamily], name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
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
                MetricType::HISTOGRAM => m.get_histogram().get_sample_count() as f64,
                _ => m.get_gauge().get_value(),
            };
            (labels, value)
        })
        .collect()
}

/// Metric `name` by the value of its label `label`.
pub fn labelled(families: &[MetricFamily], name: &str, label: &str) -> BTreeMap<String, f64> {
    series(families, name)
        .into_iter()
        .map(|(labels, v)| (labels.get(label).cloned().unwrap_or_default(), v))
        .collect()
}

/// The sum of metric `name` over its samples.
pub fn sum(families: &[MetricFamily], name: &str) -> f64 {
    series(families, name).into_iter().map(|(_, v)| v).sum()
}

/// A count with thousands separators.
pub fn number(v: f64) -> String {
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

/// A size in binary units.
pub fn bytes(v: f64) -> String {
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

/// A duration in ms, s, minutes or hours, whichever reads best.
pub fn seconds(d: Duration) -> String {
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

/// A UTC date and time, `YYYY-MM-DD HH:MM:SS`.
pub fn utc(ms: i64) -> String {
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar).
    let days = ms.div_euclid(86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {}", clock(ms))
}

/// A UTC time of day, `HH:MM:SS`.
pub fn clock(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_like_numbers() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(1234.4), "1,234");
        assert_eq!(number(-1_000_000.0), "-1,000,000");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(seconds(Duration::from_millis(250)), "250 ms");
        assert_eq!(clock(3_723_000), "01:02:03");
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_800_000_000_000), "2027-01-15 08:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(-1000), "1969-12-31 23:59:59");
    }

    #[test]
    fn data_never_becomes_markup() {
        let mut out = String::new();
        head(&mut out, "<b>");
        table(&mut out, &["a&b"], [vec!["<i>'\"".to_string()]].into_iter());
        table(
            &mut out,
            &["t"],
            [vec![link("/t?a=\"<x>", "<y>")]].into_iter(),
        );
        assert!(!out.contains("<b>") && !out.contains("<i>"), "{out}");
        assert!(out.contains("&lt;i&gt;&#39;&quot;"), "{out}");
        assert!(
            out.contains("<a href=\"/t?a=&quot;&lt;x&gt;\">&lt;y&gt;</a>"),
            "{out}"
        );
    }
}
