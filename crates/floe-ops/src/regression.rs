//! Deploy regressions: when a service starts reporting a new version, is the new version
//! worse than the one it replaces?
//!
//! **Input.** One row per request (the RED recipe's `by_service` stream) read back from an
//! exchange keyed by the service, so all of a service's requests meet in one partition, with
//! the service, its version (`service.version`), an error flag and the duration in ns.
//!
//! **Minutes.** Requests are counted per (service, version) and minute of event time, each
//! minute evaluated once, when final ([`crate::minutes`]): requests, errors and a latency
//! sketch (DDSketch, 1 % relative error).
//!
//! **Deploys.** A service's first version is its *current* one. A version it has never
//! reported before, seen in a final minute `d`, is a deploy replacing the current one, and
//! becomes current (the busiest, when several appear in one minute). Each deploy is decided
//! on its own — a hotfix deployed while the previous deploy waits is judged against that
//! one — at the end of minute `d + after − 1`, also when the service had no requests in it
//! (the clock closes it), and then at the first later minute at which both sides have
//! `min_requests`, until `d + max_wait − 1`:
//!
//! * *new*: the new version's requests in the minutes `[d, decision]`;
//! * *old*: the replaced version's requests in the matched minutes `[d − baseline, decision]`
//!   — the minutes before the deploy and, during a rolling deploy, the minutes both ran.
//!
//! Two metrics, each one row of the output with its verdict:
//!
//! | metric | value | effect | regression when |
//! |---|---|---|---|
//! | `error_rate` | errors / requests | new − old | one-sided two-proportion z-test p-value < `alpha` and effect ≥ `min_error_increase` |
//! | `latency_p99` (the configured `quantile`) | the quantile, ns, from the merged sketches | new / old | effect ≥ `latency_effect` |
//!
//! Verdicts: `regression`, `ok`, or `insufficient_traffic` when `max_wait` passed with a side
//! under `min_requests`. The old version, still running during a rollout or back after a
//! rollback, starts no deploy of its own (a service remembers its last 64 versions, never
//! forgetting the current one or one being decided). One test per metric and
//! deploy at a fixed horizon: the false-positive rate of the error test is `alpha`.
//!
//! **State** (per partition, beside the minutes' window): `0x30 service` → its current
//! version, the versions seen, the deploys pending and the newest minute checked; `0x31 service 0x00 minute version` →
//! that minute's (requests, errors, sketch), kept `baseline + max_wait` minutes.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{
    Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{Array, ArrayRef, ListArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::{StreamBatch, StreamSpec};
use floe_sketch::QuantileSketch;

use crate::aggregate::{AggKind, Aggregate};
use crate::codec::{Reader, Writer, integer_at, sortable};
use crate::minutes::{
    Closed, MINUTE, Minutes, ROW_COLUMN, RequestColumns, RequestValues, checked_input, inner_rows,
    per_minute_hooks, strings_of,
};
use crate::window::{event_times, final_stream, iceberg_schema, late_stream, timestamp};
use crate::{Context, OpError, OpResult, Operator};

/// A `regression` operator as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct RegressionSpec {
    /// The operator's id.
    pub id: String,
    /// The input's event-time column.
    pub time_column: String,
    /// How far behind the largest event time rows may arrive (µs).
    pub out_of_orderness: i64,
    /// How long after its end a minute still takes requests (µs).
    pub allowed_lateness: i64,
    /// The column naming the service.
    pub service_column: String,
    /// The column naming its version.
    pub version_column: String,
    /// The column that is non-zero (or true) for a failed request.
    pub error_column: String,
    /// The column of the request's duration (ns).
    pub duration_column: String,
    /// Minutes of the old version before the deploy compared.
    pub baseline_minutes: i64,
    /// Minutes of the new version before the decision.
    pub after_minutes: i64,
    /// Minutes after the deploy a decision waits for traffic at most.
    pub max_wait_minutes: i64,
    /// Requests each side needs for a verdict.
    pub min_requests: u64,
    /// Significance of the error-rate test.
    pub alpha: f64,
    /// The smallest error-rate increase (a fraction) that is a regression.
    pub min_error_increase: f64,
    /// The latency quantile compared.
    pub quantile: f64,
    /// The smallest ratio of the new to the old quantile that is a regression.
    pub latency_effect: f64,
    /// The verdicts stream.
    pub output: String,
    /// The late-rows stream.
    pub late_output: String,
}

/// Defaults of the settings a job file may leave out.
pub const DEFAULTS: RegressionDefaults = RegressionDefaults {
    baseline_minutes: 30,
    after_minutes: 10,
    max_wait_minutes: 60,
    min_requests: 200,
    alpha: 0.001,
    min_error_increase: 0.005,
    quantile: 0.99,
    latency_effect: 1.2,
};

/// See [`DEFAULTS`].
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct RegressionDefaults {
    pub baseline_minutes: i64,
    pub after_minutes: i64,
    pub max_wait_minutes: i64,
    pub min_requests: u64,
    pub alpha: f64,
    pub min_error_increase: f64,
    pub quantile: f64,
    pub latency_effect: f64,
}

impl RegressionSpec {
    /// A digest of what the stored state depends on: what is counted, and how long minutes
    /// are kept. Thresholds may change: they apply from the next decision on.
    pub fn fingerprint(&self) -> String {
        format!(
            "regression v1 time={} ooo={} lateness={} columns={}|{}|{}|{} q={} keep={}",
            self.time_column,
            self.out_of_orderness,
            self.allowed_lateness,
            self.service_column,
            self.version_column,
            self.error_column,
            self.duration_column,
            self.quantile,
            self.keep_minutes()
        )
    }

    fn keep_minutes(&self) -> i64 {
        self.baseline_minutes + self.max_wait_minutes
    }

    /// The latency metric's name, e.g. `latency_p99`.
    pub fn latency_metric(&self) -> String {
        let percent = format!("{:.3}", self.quantile * 100.0);
        let percent = percent
            .trim_end_matches('0')
            .trim_end_matches('.')
            .replace('.', "_");
        format!("latency_p{percent}")
    }
}

/// The columns counted per minute beside the time and the input row.
const INNER_COLUMNS: [&str; 4] = ["service", "version", "error", "duration"];

/// One side's counts.
#[derive(Debug, Clone, Default, PartialEq)]
struct Counts {
    requests: u64,
    errors: u64,
    sketch: QuantileSketch,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.sketch.merge(&other.sketch);
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.u64(self.requests);
        w.u64(self.errors);
        let buckets: Vec<(i32, u64)> = self.sketch.buckets().collect();
        w.u64(buckets.len() as u64);
        for (k, n) in buckets {
            w.i64(i64::from(k));
            w.u64(n);
        }
        w.0
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader(bytes);
        let requests = r.u64()?;
        let errors = r.u64()?;
        let n = r.u64()? as usize;
        let mut buckets = Vec::with_capacity(n);
        for _ in 0..n {
            buckets.push((r.i64()? as i32, r.u64()? as i64));
        }
        let sketch = QuantileSketch::from_buckets(buckets).map_err(|e| format!("{e:?}"))?;
        Ok(Self {
            requests,
            errors,
            sketch,
        })
    }
}

/// A deploy waiting for its decision.
#[derive(Debug, Clone, PartialEq)]
struct Pending {
    /// The version it replaces.
    old: String,
    /// The new version.
    new: String,
    /// Its first minute.
    deployed: i64,
}

/// A service's versions in one partition.
#[derive(Debug, Clone, Default, PartialEq)]
struct Track {
    /// The newest version deployed: the one the next deploy replaces.
    current: String,
    /// Every version it reported (a version seen before starts no deploy).
    seen: Vec<String>,
    /// Deploys being decided, oldest first.
    pending: Vec<Pending>,
    /// The newest final minute the pending deploys were checked at.
    checked: i64,
}

impl Track {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.bytes(self.current.as_bytes());
        w.u64(self.seen.len() as u64);
        for v in &self.seen {
            w.bytes(v.as_bytes());
        }
        w.u64(self.pending.len() as u64);
        for d in &self.pending {
            w.bytes(d.old.as_bytes());
            w.bytes(d.new.as_bytes());
            w.i64(d.deployed);
        }
        w.i64(self.checked);
        w.0
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader(bytes);
        let current = text(&mut r)?;
        let n = r.u64()? as usize;
        let mut seen = Vec::with_capacity(n.min(SEEN_VERSIONS + 1));
        for _ in 0..n {
            seen.push(text(&mut r)?);
        }
        let n = r.u64()? as usize;
        let mut pending = Vec::with_capacity(n.min(SEEN_VERSIONS));
        for _ in 0..n {
            pending.push(Pending {
                old: text(&mut r)?,
                new: text(&mut r)?,
                deployed: r.i64()?,
            });
        }
        let checked = r.i64()?;
        Ok(Self {
            current,
            seen,
            pending,
            checked,
        })
    }

    /// Forgets the oldest versions beyond [`SEEN_VERSIONS`], never the current one or one
    /// being decided.
    fn cap_seen(&mut self) {
        while self.seen.len() > SEEN_VERSIONS {
            let keep = |v: &String| {
                *v == self.current || self.pending.iter().any(|d| d.new == *v || d.old == *v)
            };
            match self.seen.iter().position(|v| !keep(v)) {
                Some(i) => {
                    self.seen.remove(i);
                }
                None => break,
            }
        }
    }
}

fn text(r: &mut Reader<'_>) -> Result<String, String> {
    String::from_utf8(r.bytes()?.to_vec()).map_err(|e| e.to_string())
}

/// The most versions a service's state remembers (oldest forgotten first).
const SEEN_VERSIONS: usize = 64;

/// The `regression` operator.
pub struct Regression {
    spec: RegressionSpec,
    outputs: Vec<StreamSpec>,
    verdicts: SchemaRef,
    /// The input's own columns (an exchange adds the source clock after them).
    input: SchemaRef,
    /// Counts per (minute, service, version).
    minutes: Minutes,
}

impl std::fmt::Debug for Regression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Regression")
            .field("id", &self.spec.id)
            .finish_non_exhaustive()
    }
}

/// The verdicts stream's columns.
fn verdict_fields() -> Vec<Field> {
    vec![
        Field::new("decided_at", timestamp(), false),
        Field::new("service_name", DataType::Utf8, false),
        Field::new("old_version", DataType::Utf8, false),
        Field::new("new_version", DataType::Utf8, false),
        Field::new("deployed_at", timestamp(), false),
        Field::new("metric", DataType::Utf8, false),
        Field::new("old_requests", DataType::Int64, false),
        Field::new("new_requests", DataType::Int64, false),
        Field::new("old_value", DataType::Float64, true),
        Field::new("new_value", DataType::Float64, true),
        Field::new("effect", DataType::Float64, true),
        Field::new("p_value", DataType::Float64, true),
        Field::new("verdict", DataType::Utf8, false),
    ]
}

/// The one-sided p-value of "the new error rate is higher" by the two-proportion z-test
/// (pooled variance); 1 when either side has no requests or no variance.
pub fn error_rate_p_value(old: (u64, u64), new: (u64, u64)) -> f64 {
    let ((n_old, e_old), (n_new, e_new)) = (old, new);
    if n_old == 0 || n_new == 0 {
        return 1.0;
    }
    let (n_old, n_new) = (n_old as f64, n_new as f64);
    let pooled = (e_old + e_new) as f64 / (n_old + n_new);
    let se = (pooled * (1.0 - pooled) * (1.0 / n_old + 1.0 / n_new)).sqrt();
    if se == 0.0 {
        return 1.0;
    }
    let z = (e_new as f64 / n_new - e_old as f64 / n_old) / se;
    0.5 * libm::erfc(z / std::f64::consts::SQRT_2)
}

impl Regression {
    /// A `regression` operator over `input`; `Err` says what is wrong with the configuration.
    pub fn new(spec: RegressionSpec, input: &StreamSpec) -> Result<Self, String> {
        let (arrow, time_type) = checked_input(
            input,
            std::slice::from_ref(&spec.service_column),
            "a deploy's comparison",
            &RequestColumns {
                time: &spec.time_column,
                strings: &[&spec.service_column, &spec.version_column],
                error: Some(&spec.error_column),
                duration: Some(&spec.duration_column),
            },
        )?;
        let inner = Schema::new(vec![
            Field::new(&spec.time_column, time_type, false),
            Field::new(INNER_COLUMNS[0], DataType::Utf8, false),
            Field::new(INNER_COLUMNS[1], DataType::Utf8, false),
            Field::new(INNER_COLUMNS[2], DataType::Int64, false),
            Field::new(INNER_COLUMNS[3], DataType::Int64, false),
            Field::new(ROW_COLUMN, DataType::Int64, false),
        ]);
        let aggregate = |name: &str, kind| Aggregate {
            name: name.into(),
            kind,
        };
        let minutes = Minutes::new(
            &spec.id,
            &inner,
            input,
            (spec.out_of_orderness, spec.allowed_lateness),
            vec![INNER_COLUMNS[0].into(), INNER_COLUMNS[1].into()],
            vec![
                aggregate("requests", AggKind::Count),
                aggregate("errors", AggKind::Sum(INNER_COLUMNS[2].into())),
                aggregate(
                    "latency",
                    AggKind::Quantile(INNER_COLUMNS[3].into(), spec.quantile),
                ),
            ],
        )?;
        let verdicts = Schema::new(verdict_fields());
        let outputs = vec![
            final_stream(
                &spec.output,
                iceberg_schema(&verdicts, &[])?,
                "decided_at",
                input,
            ),
            late_stream(input, &arrow, &spec.late_output)?,
        ];
        Ok(Self {
            outputs,
            verdicts: Arc::new(verdicts),
            input: arrow,
            minutes,
            spec,
        })
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.spec.id.clone(),
            message: message.into(),
        }
    }

    fn track_key(service: &str) -> Vec<u8> {
        let mut k = vec![0x30];
        k.extend_from_slice(service.as_bytes());
        k
    }

    fn minute_prefix(service: &str) -> Vec<u8> {
        let mut k = vec![0x31];
        k.extend_from_slice(service.as_bytes());
        k.push(0);
        k
    }

    fn minute_key(service: &str, minute: i64, version: &str) -> Vec<u8> {
        let mut k = Self::minute_prefix(service);
        k.extend_from_slice(&sortable(minute));
        k.extend_from_slice(version.as_bytes());
        k
    }

    /// The rows of `rows` for the minutes: (time, service, version, error, duration, row).
    /// Rows without a service are not requests of anyone; rows without an error flag or a
    /// duration are dead-lettered.
    fn inner(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
    ) -> OpResult<Option<RecordBatch>> {
        let times = event_times(rows, &self.spec.time_column).map_err(|e| self.invalid(e))?;
        let strings = |name: &str| strings_of(rows, name).map_err(|e| self.invalid(e));
        let services = strings(&self.spec.service_column)?;
        let versions = strings(&self.spec.version_column)?;
        let spec = &self.spec;
        let names = [
            &*spec.time_column,
            &spec.error_column,
            &spec.duration_column,
        ];
        let values = RequestValues::of(rows, &spec.id, names).map_err(|e| self.invalid(e))?;
        let mut take = Vec::new();
        let (mut service, mut version) = (StringBuilder::new(), StringBuilder::new());
        let (mut error, mut duration) = (Int64Builder::new(), Int64Builder::new());
        for (row, time) in times.iter().enumerate() {
            if services.is_null(row) {
                continue;
            }
            let Some((_, e, d)) = values.at(ctx, p, rows, (row, *time)) else {
                continue;
            };
            take.push(row as u32);
            service.append_value(services.value(row));
            version.append_value(if versions.is_null(row) {
                ""
            } else {
                versions.value(row)
            });
            error.append_value(i64::from(e != 0));
            duration.append_value(d);
        }
        if take.is_empty() {
            return Ok(None);
        }
        let field = |i: usize, ty: DataType| Field::new(INNER_COLUMNS[i], ty, false);
        let columns: Vec<(Field, ArrayRef)> = vec![
            (field(0, DataType::Utf8), Arc::new(service.finish())),
            (field(1, DataType::Utf8), Arc::new(version.finish())),
            (field(2, DataType::Int64), Arc::new(error.finish())),
            (field(3, DataType::Int64), Arc::new(duration.finish())),
        ];
        inner_rows(rows, &self.spec.time_column, take, columns)
            .map(Some)
            .map_err(|e| self.invalid(format!("minute rows: {e}")))
    }

    /// Evaluates the minutes closed, per service in minute order, then sends late rows aside.
    fn evaluate_closed(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        input: Option<&RecordBatch>,
        closed: Closed,
    ) -> OpResult<()> {
        // service → minute → version → counts
        type Closing = BTreeMap<String, BTreeMap<i64, BTreeMap<String, Counts>>>;
        let mut closing: Closing = BTreeMap::new();
        for b in &closed.rows {
            let strings = |name: &str| {
                b.column_by_name(name)
                    .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                    .expect("window rows")
            };
            let (services, versions) = (strings(INNER_COLUMNS[0]), strings(INNER_COLUMNS[1]));
            let starts = b.column_by_name("window_start").expect("window rows");
            let requests = b.column_by_name("requests").expect("window rows");
            let errors = b.column_by_name("errors").expect("window rows");
            let sketches = b
                .column_by_name("latency_sketch")
                .and_then(|c| c.as_any().downcast_ref::<ListArray>())
                .expect("window rows");
            for r in 0..b.num_rows() {
                let sketch = floe_sketch::quantile::from_list_array(sketches, r)
                    .map_err(|e| self.invalid(format!("a minute's sketch: {e:?}")))?
                    .unwrap_or_default();
                let counts = Counts {
                    requests: integer_at(requests.as_ref(), r).unwrap_or_default() as u64,
                    errors: integer_at(errors.as_ref(), r).unwrap_or_default() as u64,
                    sketch,
                };
                let minute = integer_at(starts.as_ref(), r)
                    .unwrap_or_default()
                    .div_euclid(MINUTE);
                closing
                    .entry(services.value(r).to_string())
                    .or_default()
                    .entry(minute)
                    .or_default()
                    .insert(versions.value(r).to_string(), counts);
            }
        }
        let mut out = VerdictRows::default();
        for (service, minutes) in closing {
            for (minute, versions) in minutes {
                self.evaluate(ctx, p, &service, minute, versions, &mut out)?;
            }
        }
        if let Some(open) = self.minutes.open_minute(p) {
            self.decide_idle(ctx, p, open, &mut out)?;
        }
        if out.rows > 0 {
            let batch = RecordBatch::try_new(self.verdicts.clone(), out.finish())
                .map_err(|e| self.invalid(format!("verdict rows: {e}")))?;
            ctx.emit(0, StreamBatch::single(0, batch, p));
        }
        if let Some(rows) = input {
            self.emit_late(ctx, p, rows, closed.late)?;
        }
        Ok(())
    }

    fn load_track(&self, ctx: &Context<'_>, p: u32, service: &str) -> OpResult<Option<Track>> {
        ctx.get(p, &Self::track_key(service))?
            .map(|bytes| Track::decode(&bytes).map_err(|e| self.invalid(e)))
            .transpose()
    }

    /// Minute `minute` of `service` closed with `versions`' counts.
    fn evaluate(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        service: &str,
        minute: i64,
        versions: BTreeMap<String, Counts>,
        out: &mut VerdictRows,
    ) -> OpResult<()> {
        let mut track = match self.load_track(ctx, p, service)? {
            Some(mut track) => {
                // Deploys due in the minutes since, which had no requests of the service.
                self.decide_due(ctx, p, service, &mut track, minute - 1, out)?;
                track
            }
            None => {
                // The first version is the busiest one of the service's first minute.
                let (first, _) = versions
                    .iter()
                    .max_by(|a, b| a.1.requests.cmp(&b.1.requests).then(b.0.cmp(a.0)))
                    .expect("a closed minute has a version");
                Track {
                    current: first.clone(),
                    seen: vec![first.clone()],
                    pending: Vec::new(),
                    checked: minute - 1,
                }
            }
        };
        for (version, counts) in &versions {
            ctx.put(
                p,
                &Self::minute_key(service, minute, version),
                &counts.encode(),
            )?;
        }
        // Each new version is a deploy replacing the current one; the busiest becomes current.
        let mut new: Vec<(&String, u64)> = versions
            .iter()
            .filter(|(v, _)| !track.seen.contains(v))
            .map(|(v, c)| (v, c.requests))
            .collect();
        new.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let replaced = track.current.clone();
        for (i, (v, _)) in new.into_iter().enumerate() {
            track.pending.push(Pending {
                old: replaced.clone(),
                new: v.clone(),
                deployed: minute,
            });
            track.seen.push(v.clone());
            if i == 0 {
                track.current = v.clone();
            }
        }
        track.cap_seen();
        self.decide_due(ctx, p, service, &mut track, minute, out)?;
        ctx.put(p, &Self::track_key(service), &track.encode())?;
        // Minutes no decision can reach any more.
        let mut stale = Vec::new();
        let from = Self::minute_prefix(service);
        let to = Self::minute_key(service, minute - self.spec.keep_minutes(), "");
        ctx.scan(p, &from, Some(&to), |k, _| {
            stale.push(k.to_vec());
            std::ops::ControlFlow::Continue(())
        })?;
        for k in stale {
            ctx.delete(p, &k)?;
        }
        Ok(())
    }

    /// Decides the deploys of every service of partition `p` due in the final minutes before
    /// `open`, the minute the clock is in (their services had no requests since).
    fn decide_idle(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        open: i64,
        out: &mut VerdictRows,
    ) -> OpResult<()> {
        let mut waiting: Vec<(String, Track)> = Vec::new();
        let mut failed = None;
        ctx.scan(p, &[0x30], Some(&[0x31]), |k, v| {
            match Track::decode(v) {
                Ok(t) if !t.pending.is_empty() && t.checked < open - 1 => {
                    waiting.push((String::from_utf8_lossy(&k[1..]).into_owned(), t));
                }
                Ok(_) => {}
                Err(e) => failed = Some(e),
            }
            std::ops::ControlFlow::Continue(())
        })?;
        if let Some(e) = failed {
            return Err(self.invalid(format!("a stored service: {e}")));
        }
        for (service, mut track) in waiting {
            self.decide_due(ctx, p, &service, &mut track, open - 1, out)?;
            ctx.put(p, &Self::track_key(&service), &track.encode())?;
        }
        Ok(())
    }

    /// Decides `track`'s deploys due in its final minutes up to `last`: each at the first
    /// minute from `deployed + after − 1` on with `min_requests` on both sides, or at
    /// `deployed + max_wait − 1` without.
    fn decide_due(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        service: &str,
        track: &mut Track,
        last: i64,
        out: &mut VerdictRows,
    ) -> OpResult<()> {
        let s = &self.spec;
        let mut waiting = Vec::new();
        for d in std::mem::take(&mut track.pending) {
            let horizon = d.deployed + s.after_minutes - 1;
            let give_up = d.deployed + s.max_wait_minutes - 1;
            let mut decided = false;
            for minute in (track.checked + 1).max(horizon)..=last.min(give_up) {
                let (old, new) = self.sides(ctx, p, service, &d, minute)?;
                let enough = old.requests >= s.min_requests && new.requests >= s.min_requests;
                if enough || minute == give_up {
                    let deploy = Deploy {
                        service,
                        old_version: &d.old,
                        new_version: &d.new,
                        deployed: d.deployed,
                        decided: minute,
                    };
                    self.decide(&deploy, &old, &new, enough, out);
                    decided = true;
                    break;
                }
            }
            if !decided {
                waiting.push(d);
            }
        }
        track.pending = waiting;
        track.checked = track.checked.max(last);
        Ok(())
    }

    /// (old, new) counts of deploy `d` decided at `decided`: the old version's in the matched
    /// minutes `[deployed − baseline, decided]`, the new version's in `[deployed, decided]`.
    fn sides(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        service: &str,
        d: &Pending,
        decided: i64,
    ) -> OpResult<(Counts, Counts)> {
        let (old_version, new_version, deployed) = (&d.old, &d.new, d.deployed);
        let (mut old, mut new) = (Counts::default(), Counts::default());
        let from = Self::minute_key(service, deployed - self.spec.baseline_minutes, "");
        let to = Self::minute_key(service, decided + 1, "");
        let prefix = Self::minute_prefix(service).len();
        let mut failed = None;
        ctx.scan(p, &from, Some(&to), |k, v| {
            let version = &k[prefix + 8..];
            let minute_of = |k: &[u8]| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&k[prefix..prefix + 8]);
                b
            };
            let side = if version == old_version.as_bytes() {
                Some(&mut old)
            } else if version == new_version.as_bytes() && minute_of(k) >= sortable(deployed) {
                Some(&mut new)
            } else {
                None
            };
            if let Some(side) = side {
                match Counts::decode(v) {
                    Ok(c) => side.add(&c),
                    Err(e) => {
                        failed = Some(e);
                        return std::ops::ControlFlow::Break(());
                    }
                }
            }
            std::ops::ControlFlow::Continue(())
        })?;
        if let Some(e) = failed {
            return Err(self.invalid(format!("a stored minute: {e}")));
        }
        Ok((old, new))
    }

    /// The verdict rows of a deploy.
    fn decide(
        &self,
        d: &Deploy<'_>,
        old: &Counts,
        new: &Counts,
        enough: bool,
        out: &mut VerdictRows,
    ) {
        let s = &self.spec;
        let verdict = |regressed: bool| {
            if !enough {
                "insufficient_traffic"
            } else if regressed {
                "regression"
            } else {
                "ok"
            }
        };
        let rate = |c: &Counts| (c.requests > 0).then(|| c.errors as f64 / c.requests as f64);
        let (old_rate, new_rate) = (rate(old), rate(new));
        let increase = old_rate.zip(new_rate).map(|(o, n)| n - o);
        let p_value = error_rate_p_value((old.requests, old.errors), (new.requests, new.errors));
        let regressed = increase.is_some_and(|e| e >= s.min_error_increase) && p_value < s.alpha;
        out.push(
            d,
            "error_rate",
            old,
            new,
            (old_rate, new_rate, increase, Some(p_value)),
            verdict(regressed),
        );
        let (old_q, new_q) = (
            old.sketch.quantile(s.quantile),
            new.sketch.quantile(s.quantile),
        );
        let ratio = old_q.zip(new_q).and_then(|(o, n)| (o > 0.0).then(|| n / o));
        let regressed = ratio.is_some_and(|r| r >= s.latency_effect);
        out.push(
            d,
            &s.latency_metric(),
            old,
            new,
            (old_q, new_q, ratio, None),
            verdict(regressed),
        );
    }

    fn emit_late(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
        late: Vec<(usize, i64)>,
    ) -> OpResult<()> {
        let width = self.input.fields().len();
        self.minutes
            .emit_late(ctx, p, (rows, width), late)
            .map_err(|e| self.invalid(format!("late rows: {e}")))
    }
}

/// A deploy being decided.
struct Deploy<'a> {
    service: &'a str,
    old_version: &'a str,
    new_version: &'a str,
    deployed: i64,
    decided: i64,
}

/// Verdict rows being built.
#[derive(Default)]
struct VerdictRows {
    rows: usize,
    decided: TimestampMicrosecondBuilder,
    services: StringBuilder,
    old_versions: StringBuilder,
    new_versions: StringBuilder,
    deployed: TimestampMicrosecondBuilder,
    metrics: StringBuilder,
    old_requests: Int64Builder,
    new_requests: Int64Builder,
    old_values: Float64Builder,
    new_values: Float64Builder,
    effects: Float64Builder,
    p_values: Float64Builder,
    verdicts: StringBuilder,
}

/// (old value, new value, effect, p-value) of one metric.
type Measured = (Option<f64>, Option<f64>, Option<f64>, Option<f64>);

impl VerdictRows {
    fn push(
        &mut self,
        d: &Deploy<'_>,
        metric: &str,
        old: &Counts,
        new: &Counts,
        m: Measured,
        verdict: &str,
    ) {
        self.rows += 1;
        self.decided.append_value((d.decided + 1) * MINUTE);
        self.services.append_value(d.service);
        self.old_versions.append_value(d.old_version);
        self.new_versions.append_value(d.new_version);
        self.deployed.append_value(d.deployed * MINUTE);
        self.metrics.append_value(metric);
        self.old_requests.append_value(old.requests as i64);
        self.new_requests.append_value(new.requests as i64);
        self.old_values.append_option(m.0);
        self.new_values.append_option(m.1);
        self.effects.append_option(m.2);
        self.p_values.append_option(m.3);
        self.verdicts.append_value(verdict);
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.decided.finish().with_timezone("+00:00")),
            Arc::new(self.services.finish()),
            Arc::new(self.old_versions.finish()),
            Arc::new(self.new_versions.finish()),
            Arc::new(self.deployed.finish().with_timezone("+00:00")),
            Arc::new(self.metrics.finish()),
            Arc::new(self.old_requests.finish()),
            Arc::new(self.new_requests.finish()),
            Arc::new(self.old_values.finish()),
            Arc::new(self.new_values.finish()),
            Arc::new(self.effects.finish()),
            Arc::new(self.p_values.finish()),
            Arc::new(self.verdicts.finish()),
        ]
    }
}

impl Operator for Regression {
    per_minute_hooks!(inner, evaluate_closed);

    fn on_restore(&mut self, partition: u32, ctx: &mut Context<'_>) -> OpResult<()> {
        self.minutes.on_restore(ctx, partition)
    }

    fn forget(&mut self) {
        self.minutes.forget();
    }

    fn final_frontiers(&self) -> Vec<(u32, i64)> {
        // A minute decided is stamped with its end: the open minute's start is out too.
        self.minutes
            .frontiers()
            .into_iter()
            .map(|(p, f)| (p, f + 1))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type, TimestampMicrosecondType};
    use arrow_array::{Int64Array, TimestampMicrosecondArray};
    use floe_core::exchange::SOURCE_CLOCK_COLUMN;
    use floe_state::StateStore;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    const S: i64 = 1_000_000;
    const OOO: i64 = 5 * S;
    const LATENESS: i64 = 30 * S;
    /// 2025-10-09T08:53:20Z.
    const T0: i64 = 1_760_000_000 * S;

    fn input() -> StreamSpec {
        let p = |t| Type::Primitive(t);
        let field = |id, name, t| Arc::new(NestedField::optional(id, name, p(t)));
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                field(1, "ts", PrimitiveType::Timestamptz),
                field(2, "service_name", PrimitiveType::String),
                field(3, "service_version", PrimitiveType::String),
                field(4, "error", PrimitiveType::Int),
                field(5, "duration_ns", PrimitiveType::Long),
            ])
            .build()
            .unwrap();
        StreamSpec {
            time_column: Some("ts".into()),
            properties: vec![
                (floe_core::exchange::EXCHANGED_FROM.into(), "x".into()),
                (
                    floe_core::exchange::EXCHANGED_BY.into(),
                    "service_name".into(),
                ),
            ],
            ..StreamSpec::append("requests", "requests", schema)
        }
    }

    fn spec() -> RegressionSpec {
        let d = DEFAULTS;
        RegressionSpec {
            id: "deploys".into(),
            time_column: "ts".into(),
            out_of_orderness: OOO,
            allowed_lateness: LATENESS,
            service_column: "service_name".into(),
            version_column: "service_version".into(),
            error_column: "error".into(),
            duration_column: "duration_ns".into(),
            baseline_minutes: d.baseline_minutes,
            after_minutes: d.after_minutes,
            max_wait_minutes: d.max_wait_minutes,
            min_requests: d.min_requests,
            alpha: d.alpha,
            min_error_increase: d.min_error_increase,
            quantile: d.quantile,
            latency_effect: d.latency_effect,
            output: "regressions".into(),
            late_output: "regressions_late".into(),
        }
    }

    /// A request: (time µs, service, version, error, duration ns), and its source's clock.
    type Request = (i64, String, String, i32, i64, Option<i64>);

    fn batch(rows: &[Request]) -> StreamBatch {
        let schema = Schema::new(vec![
            Field::new("ts", timestamp(), true),
            Field::new("service_name", DataType::Utf8, true),
            Field::new("service_version", DataType::Utf8, true),
            Field::new("error", DataType::Int32, true),
            Field::new("duration_ns", DataType::Int64, true),
            Field::new(SOURCE_CLOCK_COLUMN, DataType::Int64, true),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                TimestampMicrosecondArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())
                    .with_timezone("+00:00"),
            ),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
            )),
            Arc::new(arrow_array::Int32Array::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.4).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.5).collect::<Vec<_>>(),
            )),
        ];
        StreamBatch::single(
            0,
            RecordBatch::try_new(Arc::new(schema), columns).unwrap(),
            0,
        )
    }

    /// One verdict row: (service, metric), then the minutes of `deployed_at` and
    /// `decided_at` (the end of the deciding minute), versions,
    /// (old, new) requests, p-value and verdict.
    type Verdict = (
        (String, String),
        (i64, i64),
        (String, String),
        (i64, i64),
        Option<f64>,
        String,
    );

    fn verdicts(emitted: Vec<(usize, StreamBatch)>, out: &mut Vec<Verdict>, late: &mut usize) {
        for (output, b) in emitted {
            let b = b.batch;
            if output == 1 {
                *late += b.num_rows();
                continue;
            }
            let text = |n: &str, r| {
                b.column_by_name(n)
                    .unwrap()
                    .as_string::<i32>()
                    .value(r)
                    .to_string()
            };
            let int = |n: &str, r| {
                b.column_by_name(n)
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .value(r)
            };
            let minute = |n: &str, r| {
                b.column_by_name(n)
                    .unwrap()
                    .as_primitive::<TimestampMicrosecondType>()
                    .value(r)
                    .div_euclid(MINUTE)
            };
            let p_values = b
                .column_by_name("p_value")
                .unwrap()
                .as_primitive::<Float64Type>();
            for r in 0..b.num_rows() {
                out.push((
                    (text("service_name", r), text("metric", r)),
                    (minute("deployed_at", r), minute("decided_at", r)),
                    (text("old_version", r), text("new_version", r)),
                    (int("old_requests", r), int("new_requests", r)),
                    (!p_values.is_null(r)).then(|| p_values.value(r)),
                    text("verdict", r),
                ));
            }
        }
    }

    /// Runs `rows` through in chunks of `size` (the exchange's clock after each), then moves
    /// the clock an hour on; with `restart`, a fresh operator restores the state halfway.
    fn run(rows: &[Request], size: usize, restart: bool) -> (Vec<Verdict>, usize) {
        let dir = std::env::temp_dir().join(format!(
            "floe-regression-{}-{}-{}-{}",
            std::process::id(),
            rows.len(),
            size,
            restart
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let names = |p: u32| format!("x/{p}");
        let mut op = Regression::new(spec(), &input()).unwrap();
        let (mut out, mut late) = (Vec::new(), 0);
        let mut clock = i64::MIN;
        let chunks = rows.len().div_ceil(size);
        for (i, chunk) in rows.chunks(size).enumerate() {
            if restart && i == chunks / 2 {
                op = Regression::new(spec(), &input()).unwrap();
                let mut ctx = Context::new(Some(&mut store), 0, &names);
                op.on_restore(0, &mut ctx).unwrap();
            }
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            op.on_batch(&batch(chunk), &mut ctx).unwrap();
            clock = chunk.iter().map(|r| r.0).fold(clock, i64::max);
            op.on_event_clock(0, clock, &mut ctx).unwrap();
            let (emitted, dead) = ctx.finish();
            assert!(dead.is_empty());
            verdicts(emitted, &mut out, &mut late);
        }
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        op.on_event_clock(0, clock + 3600 * S, &mut ctx).unwrap();
        verdicts(ctx.finish().0, &mut out, &mut late);
        let _ = std::fs::remove_dir_all(&dir);
        (out, late)
    }

    fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state >> 33
        }
    }

    /// `minutes` of requests, `per_second` a second per service, up to 20 s out of order and
    /// 1 % two minutes late. `checkout` deploys 2.0 at minute 40: ten times the errors (0.5 %
    /// → 5 %), 1.5 times slower; `search` deploys 7.1 at minute 30, changing nothing.
    fn requests(minutes: i64, per_second: i64) -> Vec<Request> {
        let mut next = lcg(7);
        let mut out = Vec::new();
        let mut clock: Option<i64> = None;
        for i in 0..minutes * 60 * per_second {
            let nominal = T0 + i * S / per_second;
            for (service, deploy, version) in [("checkout", 40, "2.0"), ("search", 30, "7.1")] {
                let late = if next().is_multiple_of(100) {
                    120 * S
                } else {
                    0
                };
                let t = nominal - (next() % 20) as i64 * S - late;
                let deployed = nominal >= T0 + deploy * MINUTE;
                let bad = deployed && service == "checkout";
                let error = i32::from(next() % 1000 < if bad { 50 } else { 5 });
                let mut duration = 50_000_000 + (next() % 100) as i64 * 1_000_000;
                if bad {
                    duration = duration * 3 / 2;
                }
                let version = if deployed { version } else { "1.0" };
                out.push((t, service.into(), version.into(), error, duration, clock));
                clock = Some(clock.map_or(t, |c| c.max(t)));
            }
        }
        out
    }

    /// (old, new) requests of a deploy and the late rows, straight from the definitions.
    fn counted(
        rows: &[Request],
        service: &str,
        versions: (&str, &str),
        deployed: i64,
    ) -> (i64, i64, usize) {
        let decided = deployed + DEFAULTS.after_minutes - 1;
        let (mut old, mut new, mut late) = (0, 0, 0);
        for r in rows {
            let minute = r.0.div_euclid(MINUTE);
            let wm = r.5.map_or(i64::MIN, |c| c - OOO - LATENESS);
            if (minute + 1) * MINUTE <= wm {
                late += 1;
                continue;
            }
            if r.1 != service || minute > decided {
                continue;
            }
            if r.2 == versions.0 && minute >= deployed - DEFAULTS.baseline_minutes {
                old += 1;
            } else if r.2 == versions.1 && minute >= deployed {
                new += 1;
            }
        }
        (old, new, late)
    }

    #[test]
    fn a_bad_deploy_is_flagged_and_a_quiet_one_passes_whatever_the_batching() {
        let rows = requests(60, 4);
        let m0 = T0.div_euclid(MINUTE);
        let (out, late) = run(&rows, 500, false);
        let (checkout_old, checkout_new, expected_late) =
            counted(&rows, "checkout", ("1.0", "2.0"), m0 + 40);
        let (search_old, search_new, _) = counted(&rows, "search", ("1.0", "7.1"), m0 + 30);
        assert_eq!(late, expected_late);
        assert!(late > 0);
        let row = |service: &str, metric: &str| {
            out.iter()
                .find(|v| v.0 == (service.to_string(), metric.to_string()))
                .unwrap_or_else(|| panic!("no {service} {metric} in {out:?}"))
                .clone()
        };
        assert_eq!(out.len(), 4, "{out:?}");
        for metric in ["error_rate", "latency_p99"] {
            let v = row("checkout", metric);
            assert_eq!(
                v.1,
                (m0 + 40, m0 + 50),
                "decided at the end of the 10th minute"
            );
            assert_eq!(v.2, ("1.0".into(), "2.0".into()));
            assert_eq!(v.3, (checkout_old, checkout_new));
            assert_eq!(v.5, "regression", "{v:?}");
            let v = row("search", metric);
            assert_eq!(v.1, (m0 + 30, m0 + 40));
            assert_eq!(v.3, (search_old, search_new));
            assert_eq!(v.5, "ok", "{v:?}");
        }
        let p = row("checkout", "error_rate").4.unwrap();
        assert!(p < 1e-9, "{p}");
        assert!(row("checkout", "latency_p99").4.is_none());
        // Any batching, and a restore halfway, give the same verdicts.
        for (size, restart) in [(97, false), (1000, true), (333, true)] {
            assert_eq!(
                run(&rows, size, restart),
                (out.clone(), late),
                "{size} {restart}"
            );
        }
    }

    #[test]
    fn too_little_traffic_waits_then_says_so() {
        // One request every 10 s: 60 in the 10 minutes after the deploy, under 200.
        let rows: Vec<Request> = (0..6 * 120)
            .map(|i| {
                let t = T0 + i * 10 * S;
                let version = if i >= 6 * 40 { "2" } else { "1" };
                (
                    t,
                    "batch".into(),
                    version.into(),
                    0,
                    10_000_000,
                    Some(t - 10 * S),
                )
            })
            .collect();
        let (out, _) = run(&rows, 50, false);
        let m0 = T0.div_euclid(MINUTE);
        assert_eq!(out.len(), 2, "{out:?}");
        for v in &out {
            assert_eq!(v.1, (m0 + 40, m0 + 40 + DEFAULTS.max_wait_minutes));
            assert_eq!(v.5, "insufficient_traffic");
        }
    }

    /// Requests of `service` every second of `minutes` (relative to T0's minute), at
    /// `version(minute)`, each with the clock of the one before.
    fn steady(
        service: &str,
        minutes: impl Iterator<Item = i64>,
        version: impl Fn(i64) -> &'static str,
    ) -> Vec<Request> {
        let m0 = T0.div_euclid(MINUTE);
        let mut out = Vec::new();
        for m in minutes {
            for s in 0..60 {
                let t = (m0 + m) * MINUTE + s * S;
                out.push((
                    t,
                    service.into(),
                    version(m).into(),
                    0,
                    10_000_000,
                    Some(t - S),
                ));
            }
        }
        out
    }

    #[test]
    fn a_deploy_is_decided_at_its_horizon_without_requests_then() {
        // Deployed at minute 40; no requests in minute 49 (its horizon) nor after 52.
        let rows = steady("api", (0..53).filter(|m| *m != 49), |m| {
            if m >= 40 { "2" } else { "1" }
        });
        // And a service that goes quiet right after its deploy: insufficient after max_wait.
        let mut quiet = steady("quiet", 0..41, |m| if m >= 40 { "b" } else { "a" });
        let mut all = rows;
        all.append(&mut quiet);
        all.sort_by_key(|r| r.0);
        let (out, _) = run(&all, 250, false);
        let m0 = T0.div_euclid(MINUTE);
        let decided = |service: &str| -> Vec<((i64, i64), String)> {
            out.iter()
                .filter(|v| v.0.0 == service)
                .map(|v| (v.1, v.5.clone()))
                .collect()
        };
        assert_eq!(
            decided("api"),
            vec![((m0 + 40, m0 + 50), "ok".to_string()); 2],
            "{out:?}"
        );
        let max_wait = DEFAULTS.max_wait_minutes;
        assert_eq!(
            decided("quiet"),
            vec![
                (
                    (m0 + 40, m0 + 40 + max_wait),
                    "insufficient_traffic".to_string()
                );
                2
            ],
            "{out:?}"
        );
        // Restored halfway and batched otherwise: the same.
        assert_eq!(run(&all, 777, true).0, out);
    }

    #[test]
    fn a_hotfix_during_a_pending_deploy_is_judged_against_it() {
        // 2.0 at minute 40, hotfix 2.1 at minute 44 (2.0 served 240 requests: enough).
        let rows = steady("api", 0..60, |m| match m {
            ..40 => "1.0",
            40..44 => "2.0",
            _ => "2.1",
        });
        let (out, _) = run(&rows, 500, false);
        let m0 = T0.div_euclid(MINUTE);
        type Decided = ((i64, i64), (String, String), (i64, i64));
        let deploys: Vec<Decided> = out
            .iter()
            .filter(|v| v.0.1 == "error_rate")
            .map(|v| (v.1, v.2.clone(), v.3))
            .collect();
        assert_eq!(
            deploys,
            vec![
                // 2.0's four minutes against 1.0's thirty before.
                (
                    (m0 + 40, m0 + 50),
                    ("1.0".into(), "2.0".into()),
                    (30 * 60, 4 * 60)
                ),
                // 2.1's ten against 2.0's four.
                (
                    (m0 + 44, m0 + 54),
                    ("2.0".into(), "2.1".into()),
                    (4 * 60, 10 * 60)
                ),
            ],
            "{out:?}"
        );
    }

    #[test]
    fn the_error_rate_test_is_the_two_proportion_z_test() {
        // 1 % against 3 % of 1000: z = 0.02 / sqrt(0.02 · 0.98 · 0.002) = 3.194, 1 − Φ(z).
        let p = error_rate_p_value((1000, 10), (1000, 30));
        assert!((p - 0.000_701).abs() < 5e-6, "{p}");
        assert!((error_rate_p_value((1000, 10), (1000, 10)) - 0.5).abs() < 1e-12);
        assert!(error_rate_p_value((1000, 30), (1000, 10)) > 0.99);
        assert_eq!(error_rate_p_value((0, 0), (10, 1)), 1.0);
        assert_eq!(error_rate_p_value((10, 0), (10, 0)), 1.0);
    }

    /// The generator's shop, 5 seeds: `payments` 1.1.0 (4 × its errors, 1.5 × slower) is
    /// flagged by both metrics, `inventory` 2.0.0 (the same behaviour) by neither.
    #[test]
    fn the_generators_bad_deploy_is_flagged_in_five_seeds_and_its_quiet_one_never() {
        use floe_otlp::generate::{Deploy, Generator};
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        use prost::Message as _;

        let start = T0 as u64 * 1000;
        let minute = 60_000_000_000u64;
        let m0 = T0.div_euclid(MINUTE);
        for seed in 1..=5u64 {
            let deploy = |service: &str, version: &str, at: u64, factors: (f64, f64)| Deploy {
                service: service.into(),
                version: version.into(),
                at_unix_nano: start + at * minute,
                error_factor: factors.0,
                latency_factor: factors.1,
            };
            let mut g = Generator::new(seed, start)
                .with_rate(10)
                .with_deploy(deploy("payments", "1.1.0", 20, (4.0, 1.5)))
                .with_deploy(deploy("inventory", "2.0.0", 15, (1.0, 1.0)));
            let mut rows: Vec<Request> = Vec::new();
            let mut clock: Option<i64> = None;
            while rows.last().is_none_or(|r| r.0 < T0 + 35 * MINUTE) {
                let [traces, _] = g.requests(50);
                let data = opentelemetry_proto::tonic::trace::v1::TracesData::decode(
                    traces.bytes.as_slice(),
                )
                .unwrap();
                let mut newest = clock;
                for rs in data.resource_spans {
                    let attr = |key: &str| {
                        rs.resource
                            .as_ref()
                            .unwrap()
                            .attributes
                            .iter()
                            .find(|a| a.key == key)
                            .and_then(|a| match &a.value.as_ref()?.value {
                                Some(Value::StringValue(s)) => Some(s.clone()),
                                _ => None,
                            })
                            .unwrap()
                    };
                    let (service, version) = (attr("service.name"), attr("service.version"));
                    for span in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                        let t = (span.start_time_unix_nano / 1000) as i64;
                        let failed = span.status.as_ref().is_some_and(|s| s.code == 2);
                        let duration = (span.end_time_unix_nano - span.start_time_unix_nano) as i64;
                        rows.push((
                            t,
                            service.clone(),
                            version.clone(),
                            failed as i32,
                            duration,
                            clock,
                        ));
                        newest = Some(newest.map_or(t, |c| c.max(t)));
                    }
                }
                clock = newest; // one record's clock, as a source partition reports it
            }
            let (out, late) = run(&rows, 2000, seed == 3);
            assert_eq!(late, 0);
            let verdict = |service: &str, metric: &str| {
                let v = out
                    .iter()
                    .find(|v| v.0 == (service.to_string(), metric.to_string()))
                    .unwrap_or_else(|| panic!("seed {seed}: no {service} {metric}: {out:?}"));
                (v.1, v.5.clone())
            };
            for metric in ["error_rate", "latency_p99"] {
                assert_eq!(
                    verdict("payments", metric),
                    ((m0 + 20, m0 + 30), "regression".to_string()),
                    "seed {seed}"
                );
                assert_eq!(
                    verdict("inventory", metric),
                    ((m0 + 15, m0 + 25), "ok".to_string()),
                    "seed {seed}"
                );
            }
            assert_eq!(out.len(), 4, "seed {seed}: only the two deploys: {out:?}");
        }
    }
}
