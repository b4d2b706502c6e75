//! The job file parts this crate owns: `[source.generator]` (the quickstart's data) and the
//! OTLP format's `signals` map of `[source.kafka]`.
//!
//! ```toml
//! [source.generator]
//! requests_per_second = 2000   # traces of five spans and five logs each
//! duration = "20s"             # make duration × rate requests, then stop (default: run on)
//! seed = 42
//! speed = 60                   # event time runs 60 × wall time, ending now (default: 1, from now)
//! start = 2026-01-01T00:00:00Z # or from a fixed instant: the same rows in every run
//! # a new version of one service, `at` into the event time, with more errors and slower
//! deploy = { service = "payments", version = "1.1.0", at = "6m", error_factor = 4, latency_factor = 1.5 }
//! # incidents for alerting to find: errors originating in a service (they propagate to its
//! # callers), one endpoint slower, a connection pool climbing to full
//! incidents = [
//!   { service = "inventory", kind = "errors", at = "40m", for = "10m", factor = 20 },
//!   { service = "checkout", kind = "slow", endpoint = "PlaceOrder", at = "60m", for = "10m", factor = 3 },
//!   { service = "payments", kind = "saturation", at = "80m", for = "30m" },
//! ]
//! ```

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use floe_config::{Checker, Text};
use serde::Deserialize;
use toml::Spanned;

use crate::Signal;

/// `[source.generator]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGenerator {
    /// Requests (a trace of five spans and five logs each) per second (default 2000).
    pub requests_per_second: Option<Spanned<i64>>,
    /// Stop after this long (default: until stopped).
    pub duration: Option<Text>,
    /// Seed of the generated data (default 42).
    pub seed: Option<Spanned<i64>>,
    /// Event-time seconds per wall-clock second (default 1).
    pub speed: Option<Spanned<i64>>,
    /// The event time of the first request (default: now, less the head start `speed` gives).
    pub start: Option<Spanned<toml::value::Datetime>>,
    /// A deploy at a known event time.
    pub deploy: Option<Spanned<RawDeploy>>,
    /// Incidents at known event times.
    #[serde(default)]
    pub incidents: Vec<Spanned<RawIncident>>,
}

/// One of `incidents = [{…}]` of `[source.generator]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIncident {
    /// One of the generated services.
    pub service: Option<Text>,
    /// `errors`, `slow` or `saturation`.
    pub kind: Option<Text>,
    /// Event time after the start.
    pub at: Option<Text>,
    /// How long it lasts.
    #[serde(rename = "for")]
    pub lasts: Option<Text>,
    /// `errors`, `slow`: the factor.
    pub factor: Option<Spanned<f64>>,
    /// `slow`: the endpoint (span name).
    pub endpoint: Option<Text>,
}

/// An incident, its times after the generator's start.
#[derive(Debug, Clone, PartialEq)]
pub struct IncidentConfig {
    /// The service.
    pub service: String,
    /// What goes wrong.
    pub kind: crate::generate::IncidentKind,
    /// Event time after the start.
    pub at: Duration,
    /// How long.
    pub lasts: Duration,
}

/// `deploy = {…}` of `[source.generator]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeploy {
    /// One of the generated services.
    pub service: Option<Text>,
    /// The version it reports from then on.
    pub version: Option<Text>,
    /// Event time after the start.
    pub at: Option<Text>,
    /// Multiplies its errors' rate (default 1).
    pub error_factor: Option<Spanned<f64>>,
    /// Multiplies its latency (default 1).
    pub latency_factor: Option<Spanned<f64>>,
}

/// A deploy `at` event time after the generator's start.
#[derive(Debug, Clone, PartialEq)]
pub struct DeployConfig {
    /// The service.
    pub service: String,
    /// Its new version.
    pub version: String,
    /// Event time after the start.
    pub at: Duration,
    /// Factor of its errors.
    pub error_factor: f64,
    /// Factor of its latency.
    pub latency_factor: f64,
}

/// The generator's settings.
#[derive(Debug, Clone)]
pub struct GeneratorConfig {
    /// Requests per second.
    pub requests_per_second: u64,
    /// Make this long of requests at the rate, then stop (`None`: until stopped).
    pub duration: Option<Duration>,
    /// Seed of the data.
    pub seed: u64,
    /// Event-time seconds per wall-clock second.
    pub speed: u64,
    /// The event time of the first request, ns since the epoch (`None`: from the clock).
    pub start_unix_nano: Option<u64>,
    /// A deploy, if any.
    pub deploy: Option<DeployConfig>,
    /// Incidents.
    pub incidents: Vec<IncidentConfig>,
}

/// ns since the epoch of a TOML offset date-time (`2026-01-01T00:00:00Z`); `None` for a local
/// date-time, a date or a time alone, or an instant before 1970.
fn unix_nano(t: &toml::value::Datetime) -> Option<u64> {
    let (date, time) = (t.date?, t.time?);
    let offset_minutes = match t.offset? {
        toml::value::Offset::Z => 0,
        toml::value::Offset::Custom { minutes } => i64::from(minutes),
    };
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    let (y, m, d) = (
        i64::from(date.year),
        i64::from(date.month),
        i64::from(date.day),
    );
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400
        + i64::from(time.hour) * 3600
        + i64::from(time.minute) * 60
        + i64::from(time.second)
        - offset_minutes * 60;
    let nanos = seconds.checked_mul(1_000_000_000)? + i64::from(time.nanosecond);
    u64::try_from(nanos).ok()
}

impl RawGenerator {
    /// The typed settings; problems go to `c`.
    pub fn check(&self, c: &mut Checker<'_>) -> GeneratorConfig {
        GeneratorConfig {
            requests_per_second: c.integer(
                self.requests_per_second.as_ref(),
                "requests_per_second",
                1..=10_000_000,
                2_000,
            ) as u64,
            duration: self
                .duration
                .as_ref()
                .map(|d| c.duration(Some(d), Duration::from_secs(30))),
            seed: self.seed.as_ref().map_or(42, |s| *s.get_ref() as u64),
            speed: c.integer(self.speed.as_ref(), "speed", 1..=3600, 1) as u64,
            start_unix_nano: self.start.as_ref().and_then(|t| {
                let at = unix_nano(t.get_ref());
                if at.is_none() {
                    c.at(
                        t,
                        "`start` is an instant with its offset after 1970, e.g. \
                         2026-01-01T00:00:00Z",
                    );
                }
                at
            }),
            deploy: self.deploy.as_ref().and_then(|d| deploy(c, d)),
            incidents: self
                .incidents
                .iter()
                .filter_map(|i| incident(c, i))
                .collect(),
        }
    }
}

fn incident(c: &mut Checker<'_>, raw: &Spanned<RawIncident>) -> Option<IncidentConfig> {
    use crate::generate::{Generator, IncidentKind};
    let i = raw.get_ref();
    let service = c.opt(i.service.as_ref());
    let endpoints = match &service {
        None => {
            c.at(raw, "an incident names its `service`");
            return None;
        }
        Some(s) => match Generator::endpoints(s) {
            Some(e) => e,
            None => {
                let names: Vec<&str> = Generator::services().collect();
                c.at(
                    i.service.as_ref().expect("given"),
                    format!("the generator's services are {}", names.join(", ")),
                );
                return None;
            }
        },
    };
    let factor = match &i.factor {
        Some(f) if *f.get_ref() > 0.0 && f.get_ref().is_finite() => Some(*f.get_ref()),
        Some(f) => {
            c.at(f, "a factor is a positive number");
            return None;
        }
        None => None,
    };
    let kind = match c.opt(i.kind.as_ref()).as_deref() {
        Some("errors") => IncidentKind::Errors {
            factor: factor.unwrap_or(10.0),
        },
        Some("slow") => {
            let Some(endpoint) = c.opt(i.endpoint.as_ref()) else {
                c.at(
                    raw,
                    format!(
                        "a slow incident names its `endpoint`: one of {}",
                        endpoints.join(", ")
                    ),
                );
                return None;
            };
            if !endpoints.contains(&endpoint.as_str()) {
                c.at(
                    i.endpoint.as_ref().expect("given"),
                    format!(
                        "the endpoints of {} are {}",
                        service.as_deref().unwrap_or(""),
                        endpoints.join(", ")
                    ),
                );
                return None;
            }
            IncidentKind::Slow {
                endpoint,
                factor: factor.unwrap_or(3.0),
            }
        }
        Some("saturation") => IncidentKind::Saturation,
        other => {
            let at = i.kind.as_ref().map_or(raw.span(), |k| k.span());
            c.problem(
                Some(at),
                format!(
                    "an incident's `kind` is \"errors\", \"slow\" or \"saturation\", not {other:?}"
                ),
            );
            return None;
        }
    };
    let at = c.duration_or_zero(i.at.as_ref(), Duration::ZERO);
    let lasts = c.duration(i.lasts.as_ref(), Duration::from_secs(600));
    if lasts.is_zero() {
        c.at(
            i.lasts.as_ref().expect("zero is given"),
            "an incident lasts a while",
        );
        return None;
    }
    Some(IncidentConfig {
        service: service?,
        kind,
        at,
        lasts,
    })
}

fn deploy(c: &mut Checker<'_>, raw: &Spanned<RawDeploy>) -> Option<DeployConfig> {
    let d = raw.get_ref();
    let service = c.opt(d.service.as_ref());
    match &service {
        None => c.at(raw, "a deploy names its `service`"),
        Some(s) if !crate::generate::Generator::services().any(|g| g == s) => {
            let at = d.service.as_ref().expect("given");
            let names: Vec<&str> = crate::generate::Generator::services().collect();
            c.at(
                at,
                format!("the generator's services are {}", names.join(", ")),
            );
        }
        Some(_) => {}
    }
    let version = c.opt(d.version.as_ref());
    if version.is_none() {
        c.at(raw, "a deploy names its new `version`");
    }
    let at = c.duration_or_zero(d.at.as_ref(), Duration::ZERO);
    let factor = |c: &mut Checker<'_>, v: &Option<Spanned<f64>>| match v {
        None => Some(1.0),
        Some(f) if *f.get_ref() > 0.0 && f.get_ref().is_finite() => Some(*f.get_ref()),
        Some(f) => {
            c.at(f, "a factor is a positive number (1: unchanged)");
            None
        }
    };
    let error_factor = factor(c, &d.error_factor);
    let latency_factor = factor(c, &d.latency_factor);
    Some(DeployConfig {
        service: service?,
        version: version?,
        at,
        error_factor: error_factor?,
        latency_factor: latency_factor?,
    })
}

/// The OTLP format's topic → signal map (`signals = { my_spans = "traces" }`); problems go to
/// `c`.
pub fn check_signals(raw: &BTreeMap<String, Text>, c: &mut Checker<'_>) -> HashMap<String, Signal> {
    let mut signals = HashMap::new();
    for (topic, signal) in raw {
        match Signal::parse(&c.text(signal)) {
            Some(s) => {
                signals.insert(topic.clone(), s);
            }
            None => c.at(
                signal,
                "a signal is \"traces\", \"logs\", \"metrics\" or \"profiles\"",
            ),
        }
    }
    signals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datetime(text: &str) -> toml::value::Datetime {
        text.parse().unwrap()
    }

    #[test]
    fn a_start_instant_is_its_unix_time_whatever_its_offset() {
        let s = 1_000_000_000;
        assert_eq!(unix_nano(&datetime("1970-01-01T00:00:00Z")), Some(0));
        assert_eq!(
            unix_nano(&datetime("2026-01-01T00:00:00Z")),
            Some(1_767_225_600 * s)
        );
        assert_eq!(
            unix_nano(&datetime("2026-01-01T01:00:00+01:00")),
            Some(1_767_225_600 * s)
        );
        assert_eq!(
            unix_nano(&datetime("2024-02-29T12:30:15.5Z")),
            Some(1_709_209_815 * s + s / 2)
        );
        // Local times, dates alone and instants before 1970 are not starts.
        assert_eq!(unix_nano(&datetime("2026-01-01T00:00:00")), None);
        assert_eq!(unix_nano(&datetime("2026-01-01")), None);
        assert_eq!(unix_nano(&datetime("1969-12-31T23:59:59Z")), None);
    }
}
