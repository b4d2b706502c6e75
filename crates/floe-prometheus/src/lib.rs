//! `floe-prometheus`: Prometheus remote write as a [`Mirror`] of a committed table — the
//! derived series (SLIs, burn rates, anomaly scores, forecasts) each sample once (ADR 0010).
//!
//! * **Samples** come from the rows a snapshot added ([`series`]).
//! * **Atomic with a marker.** Every request also carries one sample of
//!   `floe_sink_progress{floe_sink="<job>.<sink>", floe_table="<table uuid>"}` whose value is
//!   the snapshot's sequence number. Prometheus appends a request's samples all or none, so
//!   the marker is there exactly when the samples are.
//! * **Claim** reads the marker's newest sample back through the HTTP API; a request whose
//!   answer was lost is therefore never sent again blindly: the next claim sees whether it
//!   landed. (An identical resend is harmless only for each series' newest sample; an older
//!   one fails the whole request as out of order.)
//! * **Refused samples.** Prometheus refuses a request whole (400) when one sample is older
//!   than its series' newest — a late row, or a sample it already holds (a table made again,
//!   a run resumed from a savepoint). The sink then sends the snapshot series by series, and
//!   a refused series sample by sample, counts what stays refused (logged; Prometheus' own
//!   clients drop such batches), and sends the marker last. Sent again after a crash, the
//!   same samples are refused again: each is held once either way. Per-minute final rows
//!   (SLO status, anomaly scores, forecasts) come in time order and never take this path.
//! * The marker's time is the newest sample time sent so far (a millisecond past its own last
//!   one at least), so it moves forward with them.

use std::sync::Mutex;
use std::time::Duration;

use floe_core::mirror::Mirroring;
use floe_core::{Delivery, Mirror, SourceError};

pub mod series;
mod wire;

pub use series::SeriesSpec;
use wire::{Label, Sample, TimeSeries, WriteRequest};

/// The marker series' name.
pub const PROGRESS: &str = "floe_sink_progress";

/// What a Prometheus mirror needs.
#[derive(Debug, Clone)]
pub struct PrometheusSettings {
    /// The remote-write endpoint (`…/api/v1/write`).
    pub url: String,
    /// The HTTP API's base, where the marker is read back (`http://host:9090`).
    pub query_url: String,
    /// `<job>.<sink>`: the marker's `floe_sink` label.
    pub sink: String,
    /// How rows become samples.
    pub series: SeriesSpec,
}

impl PrometheusSettings {
    /// The HTTP API's base for a remote-write `url`: the URL without `/api/v1/write`.
    pub fn query_url_of(url: &str) -> String {
        url.trim_end_matches('/')
            .trim_end_matches("/api/v1/write")
            .to_string()
    }
}

/// Prometheus, mirroring a table.
#[derive(Debug)]
pub struct PrometheusMirror {
    settings: PrometheusSettings,
    http: reqwest::Client,
    /// The marker's newest time (ms) as claimed or sent.
    marker_at: Mutex<Option<i64>>,
}

fn external(what: &str, e: impl std::fmt::Display) -> SourceError {
    SourceError::external(format!("{what}: {e}"))
}

impl PrometheusMirror {
    /// A mirror writing to `settings.url`.
    pub fn new(settings: PrometheusSettings) -> Result<Self, SourceError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| SourceError::user(format!("cannot create an HTTP client: {e}")))?;
        Ok(Self {
            settings,
            http,
            marker_at: Mutex::new(None),
        })
    }

    fn marker_at(&self) -> std::sync::MutexGuard<'_, Option<i64>> {
        self.marker_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `timeseries`: `Ok(Err(why))` when Prometheus refused them (400), `Err` when it
    /// could not be asked or failed otherwise.
    async fn post(&self, timeseries: Vec<TimeSeries>) -> Result<Result<(), String>, SourceError> {
        let body = wire::body(&WriteRequest { timeseries })
            .map_err(|e| SourceError::internal(format!("cannot compress: {e}")))?;
        let response = self
            .http
            .post(&self.settings.url)
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .body(body)
            .send()
            .await
            .map_err(|e| external(&format!("cannot write to {}", self.settings.url), e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(Ok(()));
        }
        let text = response.text().await.unwrap_or_default();
        let why = format!("{} answered {status}: {}", self.settings.url, text.trim());
        if status == reqwest::StatusCode::BAD_REQUEST {
            Ok(Err(why))
        } else {
            Err(SourceError::external(why))
        }
    }

    /// The marker's newest sample: (table UUID, sequence, time ms).
    async fn read_marker(&self) -> Result<Option<(String, i64, i64)>, SourceError> {
        let query = format!(
            "{PROGRESS}{{floe_sink=\"{}\"}}[100y]",
            self.settings
                .sink
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
        );
        let url = format!("{}/api/v1/query", self.settings.query_url);
        let response = self
            .http
            .get(&url)
            .query(&[("query", query.as_str())])
            .send()
            .await
            .map_err(|e| external(&format!("cannot query {url}"), e))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| external(&format!("cannot read the answer of {url}"), e))?;
        if !status.is_success() {
            return Err(SourceError::external(format!(
                "{url} answered {status}: {text}"
            )));
        }
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| external(&format!("{url} answered no JSON"), e))?;
        let mut newest: Option<(String, i64, i64)> = None;
        for series in json["data"]["result"].as_array().into_iter().flatten() {
            let table = series["metric"]["floe_table"].as_str().unwrap_or_default();
            let Some([at, value]) = series["values"]
                .as_array()
                .and_then(|v| v.last())
                .and_then(|v| v.as_array())
                .map(|v| v.as_slice())
            else {
                continue;
            };
            let (Some(at), Some(value)) = (
                at.as_f64(),
                value.as_str().and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            let at = (at * 1000.0).round() as i64;
            if newest.as_ref().is_none_or(|n| at > n.2) {
                newest = Some((table.to_string(), value as i64, at));
            }
        }
        Ok(newest)
    }
}

impl Mirror for PrometheusMirror {
    fn describe(&self) -> String {
        format!("prometheus {}", self.settings.url)
    }

    fn claim(&self) -> Mirroring<'_, Option<(String, i64)>> {
        Box::pin(async move {
            let newest = self.read_marker().await?;
            *self.marker_at() = newest.as_ref().map(|n| n.2);
            Ok(newest.map(|(table, sequence, _)| (table, sequence)))
        })
    }

    fn deliver(&self, delivery: Delivery) -> Mirroring<'_, ()> {
        Box::pin(async move {
            let by_series = series::series(&delivery.batches, &self.settings.series)
                .map_err(|e| SourceError::user(format!("prometheus sink: {e}")))?;
            let newest = by_series
                .values()
                .filter_map(|samples| samples.keys().next_back().copied())
                .max();
            // Strictly after the marker's last sample: one time, one value.
            let at = match (newest, *self.marker_at()) {
                (Some(n), Some(m)) => n.max(m + 1),
                (None, Some(m)) => m + 1,
                (n, None) => n.unwrap_or(0),
            };
            let mut timeseries = series::to_wire(by_series);
            let mut labels = vec![
                Label {
                    name: "__name__".into(),
                    value: PROGRESS.into(),
                },
                Label {
                    name: "floe_sink".into(),
                    value: self.settings.sink.clone(),
                },
                Label {
                    name: "floe_table".into(),
                    value: delivery.table_uuid.clone(),
                },
            ];
            labels.sort();
            timeseries.push(TimeSeries {
                labels,
                samples: vec![Sample {
                    value: delivery.sequence as f64,
                    timestamp: at,
                }],
            });
            let marker = timeseries.pop().expect("the marker");
            let mut whole = timeseries.clone();
            whole.push(marker.clone());
            if self.post(whole).await?.is_err() {
                let mut refused = 0;
                let mut first = None;
                for series in timeseries {
                    if self.post(vec![series.clone()]).await?.is_ok() {
                        continue;
                    }
                    for sample in series.samples {
                        let one = TimeSeries {
                            labels: series.labels.clone(),
                            samples: vec![sample],
                        };
                        if let Err(why) = self.post(vec![one]).await? {
                            refused += 1;
                            first.get_or_insert(why);
                        }
                    }
                }
                if let Err(why) = self.post(vec![marker]).await? {
                    return Err(SourceError::external(format!(
                        "{} refused the progress marker: {why}",
                        self.settings.url
                    )));
                }
                if refused > 0 {
                    tracing::warn!(
                        sink = %self.settings.sink,
                        refused,
                        first = first.unwrap_or_default(),
                        "Prometheus refused samples older than their series' newest (held already, or late)"
                    );
                }
            }
            *self.marker_at() = Some(at);
            Ok(())
        })
    }
}
