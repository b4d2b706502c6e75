//! The service map: caller → callee edges per minute, from parent and child spans of one
//! trace that belong to different services (`kind = "edges"`, table `otel_service_edges`).
//!
//! **What an edge is.** A span *C* of service *B* whose parent span *P* (same trace,
//! `C.parent_span_id = P.span_id`) belongs to another service *A* is one request from *A* to
//! *B* — typically *A*'s CLIENT span and *B*'s SERVER span, or a PRODUCER and its CONSUMER.
//! The edge is counted in the minute of *C*'s start, with *C*'s duration and error flag (the
//! callee's view, as the Collector's `servicegraph` connector reports the server side).
//! A child joins its parent only if it starts at most `join_window` after it; a child whose
//! parent never arrives (an uninstrumented caller) makes no edge.
//!
//! **Where.** Parent and child must meet in one partition: the input is read back from an
//! exchange keyed by `trace_id` (or is one partition). Each minute then has one row per
//! (caller, callee) **and exchange partition** (`source_partition`) — partial rows that merge
//! exactly with the `GROUP BY` of `crates/floe-sketch/SQL.md`, or by `floe-maintenance
//! merge`, as for any window whose key is not the exchange's key.
//!
//! **Exactly the same rows in every run.** Spans wait in keyed state for their partner — a
//! parent for its children, a child for its parent — and leave it by event-time timers on
//! the exchange's clock. The clock reaches a partition at instants that depend on timing,
//! so forgetting a span could decide whether an edge is made; it never does here: an edge
//! carries the later of its two spans' source clocks, and a span is forgotten only once any
//! edge it could still make would be late by that clock for its minute (the minute ended
//! more than out-of-orderness plus `allowed_lateness` before). Late edges are counted
//! (`late_rows` in `/metrics`) and dropped — never written, so what is written does not
//! depend on what was forgotten when.
//!
//! **State** (per partition, beside the window's own): one entry per trace, `0x42 trace` →
//! its spans that may still get children and its children waiting for a parent, compactly
//! (variable-length integers, times relative to the trace's earliest start, each service
//! once, hex span ids in half the bytes); and [`EXPIRY`] timers that are expiry lists — one
//! per minute and batch, at the minute after its traces' last spans are due, carrying their
//! keys. A trace is on one list at a time: when spans that are due later join it, it moves to
//! a later list and the move is recorded (`0x43 minute trace`), so a list that fires removes
//! its traces without reading them, skipping those that moved. A trace's spans mostly arrive
//! together — the Collector batches a service's spans, and the exchange keeps a trace's rows
//! in order in one partition — so a trace costs one state read and one write per batch it
//! appears in and one blind delete when it is forgotten, not a few writes per span, and no
//! timer of its own. Keeping a span longer than its own expiry changes nothing written: an
//! edge it makes then is late.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::exchange::SOURCE_CLOCK_COLUMN;
use floe_core::{StreamBatch, StreamSpec};

use crate::aggregate::{AggKind, Aggregate};
use crate::codec::{Reader, Writer, sortable};
use crate::minutes::{MINUTE, RequestColumns, RequestValues, checked_input, strings_of};
use crate::timers::EXPIRY;
use crate::window::{Window, WindowKind, WindowSpec, event_times, iceberg_schema, timestamp};
use crate::{Context, FastHash, OpError, OpResult, Operator, OperatorStats};

/// The columns of the spans the operator reads, besides the configurable ones.
pub const SPAN_COLUMNS: [&str; 3] = ["trace_id", "span_id", "parent_span_id"];

/// The latency quantiles of every edge row.
pub const QUANTILES: [(&str, f64); 3] = [("p50_ns", 0.5), ("p95_ns", 0.95), ("p99_ns", 0.99)];

/// An `edges` operator as the job file gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgesSpec {
    /// The operator's id.
    pub id: String,
    /// The input's event-time column (a span's start).
    pub time_column: String,
    /// The input stream's out-of-orderness (µs).
    pub out_of_orderness: i64,
    /// How long a minute's row still takes edges after it fired (µs).
    pub allowed_lateness: i64,
    /// The longest a child may start after its parent and still be joined to it (µs).
    pub join_window: i64,
    /// The column naming a span's service.
    pub service_column: String,
    /// The column that is non-zero for a failed span.
    pub error_column: String,
    /// The column of a span's duration in ns.
    pub duration_column: String,
    /// The output stream.
    pub output: String,
    /// The stream of each minute's row once more when it can no longer change (default
    /// `<output>_final`): what an exchange can carry on (ADR 0010).
    pub final_output: String,
}

impl EdgesSpec {
    /// Everything the stored state depends on.
    pub fn fingerprint(&self) -> String {
        format!(
            "edges v4 time={} ooo={} lateness={} join={}",
            self.time_column, self.out_of_orderness, self.allowed_lateness, self.join_window
        )
    }

    /// A clock at which no edge of a child starting at `start` can be on time any more: its
    /// minute's end plus out-of-orderness and allowed lateness (a µs past it, whichever way
    /// the window rounds).
    fn child_expires(&self, start: i64) -> i64 {
        let minute_end = start.div_euclid(MINUTE).saturating_add(1) * MINUTE;
        minute_end
            .saturating_add(self.out_of_orderness)
            .saturating_add(self.allowed_lateness)
            .saturating_add(1)
    }

    /// Whether `child` is a request from `parent`'s service to another (both of one trace):
    /// a different service, starting at most `join_window` after its parent.
    fn joins(&self, parent: &Parent, child: &Child) -> bool {
        parent.service != child.service
            && child.start <= parent.start.saturating_add(self.join_window)
    }

    /// The same for any child of a parent starting at `start`.
    fn parent_expires(&self, start: i64) -> i64 {
        self.child_expires(start.saturating_add(self.join_window))
    }
}

/// A span that may still get children: its service (an index into its trace's services),
/// start and source clock — all an edge needs of its caller.
#[derive(Debug, Clone, PartialEq)]
struct Parent {
    service: u32,
    start: i64,
    clock: Option<i64>,
}

/// A span waiting for its parent, with what its edge will carry.
#[derive(Debug, Clone, PartialEq)]
struct Child {
    service: u32,
    start: i64,
    duration: i64,
    error: i64,
    clock: Option<i64>,
}

/// A span id as kept and matched: lowercase hex (as OTLP ids land) in half the bytes,
/// anything else as it is; a first byte tells which, so the two never collide.
fn compact_id(id: &str) -> Vec<u8> {
    let hex = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let raw = id.as_bytes();
    if raw.len().is_multiple_of(2) {
        let mut out = Vec::with_capacity(1 + raw.len() / 2);
        out.push(0);
        for pair in raw.chunks_exact(2) {
            match (hex(pair[0]), hex(pair[1])) {
                (Some(high), Some(low)) => out.push(high << 4 | low),
                _ => break,
            }
        }
        if out.len() == 1 + raw.len() / 2 {
            return out;
        }
    }
    let mut out = Vec::with_capacity(1 + raw.len());
    out.push(1);
    out.extend_from_slice(raw);
    out
}

/// What one trace keeps between batches: one state entry, so a trace whose spans arrive
/// together costs one read and one write, not a few per span.
#[derive(Debug, Default, Clone, PartialEq)]
struct Trace {
    /// The minute of the expiry list the trace is on, once it is on one.
    timer: Option<i64>,
    /// The services of its spans, each once.
    services: Vec<String>,
    /// Spans that may still get children, by compact span id.
    parents: BTreeMap<Vec<u8>, Parent>,
    /// Children waiting for their parent: (parent's compact span id, child).
    waiting: Vec<(Vec<u8>, Child)>,
}

/// A clock that may be missing, relative to `base`.
fn write_clock(w: &mut Writer, clock: Option<i64>, base: i64) {
    match clock {
        Some(c) => {
            w.u8(1);
            w.zigzag(c.wrapping_sub(base));
        }
        None => w.u8(0),
    }
}

fn read_clock(r: &mut Reader<'_>, base: i64) -> Result<Option<i64>, String> {
    Ok(match r.u8()? {
        0 => None,
        _ => Some(r.zigzag()?.wrapping_add(base)),
    })
}

impl Trace {
    /// Layout 3: variable-length integers, times relative to the earliest start, services
    /// once per trace, compact span ids — about a third of layout 2.
    const VERSION: u8 = 3;

    /// The index of `service` in [`Self::services`], added if new.
    fn service(&mut self, service: &str) -> u32 {
        match self.services.iter().position(|s| s == service) {
            Some(i) => i as u32,
            None => {
                self.services.push(service.to_string());
                (self.services.len() - 1) as u32
            }
        }
    }

    fn encode(&self) -> Vec<u8> {
        // Only the services of spans still kept, renumbered in order of use.
        let mut used: Vec<Option<u32>> = vec![None; self.services.len()];
        let mut names: Vec<&str> = Vec::new();
        let mut renumber = |service: u32| {
            let slot = &mut used[service as usize];
            *slot.get_or_insert_with(|| {
                names.push(&self.services[service as usize]);
                (names.len() - 1) as u32
            })
        };
        let parents: Vec<u32> = self.parents.values().map(|k| renumber(k.service)).collect();
        let waiting: Vec<u32> = self
            .waiting
            .iter()
            .map(|(_, k)| renumber(k.service))
            .collect();
        let base = (self.parents.values().map(|k| k.start))
            .chain(self.waiting.iter().map(|(_, k)| k.start))
            .min()
            .unwrap_or(0);
        let mut w = Writer(Vec::with_capacity(
            24 + 16 * names.len() + 32 * (parents.len() + waiting.len()),
        ));
        w.u8(Self::VERSION);
        write_clock(&mut w, self.timer, 0);
        w.zigzag(base);
        w.varint(names.len() as u64);
        for name in names {
            w.short_bytes(name.as_bytes());
        }
        w.varint(self.parents.len() as u64);
        for ((span, kept), service) in self.parents.iter().zip(parents) {
            w.short_bytes(span);
            w.varint(u64::from(service));
            w.zigzag(kept.start.wrapping_sub(base));
            write_clock(&mut w, kept.clock, base);
        }
        w.varint(self.waiting.len() as u64);
        for ((parent, kept), service) in self.waiting.iter().zip(waiting) {
            w.short_bytes(parent);
            w.varint(u64::from(service));
            w.zigzag(kept.start.wrapping_sub(base));
            w.zigzag(kept.duration);
            w.zigzag(kept.error);
            write_clock(&mut w, kept.clock, base);
        }
        w.0
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader(bytes);
        if r.u8()? != Self::VERSION {
            return Err("a trace's spans in a layout of another version".into());
        }
        let timer = read_clock(&mut r, 0)?;
        let base = r.zigzag()?;
        let text = |r: &mut Reader<'_>| {
            String::from_utf8(r.short_bytes()?.to_vec()).map_err(|e| e.to_string())
        };
        let services = (0..r.varint()?)
            .map(|_| text(&mut r))
            .collect::<Result<Vec<_>, _>>()?;
        let service = |r: &mut Reader<'_>| {
            let i = r.varint()?;
            match i < services.len() as u64 {
                true => Ok(i as u32),
                false => Err(format!("a span of service #{i} of {}", services.len())),
            }
        };
        let mut parents = BTreeMap::new();
        for _ in 0..r.varint()? {
            let span = r.short_bytes()?.to_vec();
            let kept = Parent {
                service: service(&mut r)?,
                start: r.zigzag()?.wrapping_add(base),
                clock: read_clock(&mut r, base)?,
            };
            parents.insert(span, kept);
        }
        let mut waiting = Vec::new();
        for _ in 0..r.varint()? {
            let parent = r.short_bytes()?.to_vec();
            let kept = Child {
                service: service(&mut r)?,
                start: r.zigzag()?.wrapping_add(base),
                duration: r.zigzag()?,
                error: r.zigzag()?,
                clock: read_clock(&mut r, base)?,
            };
            waiting.push((parent, kept));
        }
        Ok(Self {
            timer,
            services,
            parents,
            waiting,
        })
    }

    /// The clock at which every span kept can be forgotten.
    fn expires(&self, spec: &EdgesSpec) -> Option<i64> {
        let parents = self.parents.values().map(|k| spec.parent_expires(k.start));
        let children = self
            .waiting
            .iter()
            .map(|(_, k)| spec.child_expires(k.start));
        parents.chain(children).max()
    }

    /// Forgets the spans whose every edge would be late at `clock`.
    fn forget_due(&mut self, spec: &EdgesSpec, clock: i64) {
        self.parents
            .retain(|_, k| spec.parent_expires(k.start) > clock);
        self.waiting
            .retain(|(_, k)| spec.child_expires(k.start) > clock);
    }

    /// Joins span `span` (child of `parent`, if it has one) to what the trace holds, pushing
    /// the edges it makes, and keeps it for what may still come.
    fn arrive(
        &mut self,
        spec: &EdgesSpec,
        (span, parent): (Vec<u8>, Option<Vec<u8>>),
        service: &str,
        this: Child,
        found: &mut Found,
    ) {
        let this = Child {
            service: self.service(service),
            ..this
        };
        // The clock at or past which an entry is not worth keeping: what it joins is late.
        let worthless = |expires: i64| this.clock.is_some_and(|c| c >= expires);
        let name = |i: u32| self.services[i as usize].as_str();
        // As a child: its parent may be here already.
        if let Some(parent) = parent {
            if let Some(caller) = self.parents.get(&parent) {
                if spec.joins(caller, &this) {
                    let clock = later(caller.clock, this.clock);
                    found.push(name(caller.service), name(this.service), &this, clock);
                }
            } else if !worthless(spec.child_expires(this.start)) {
                self.waiting.push((parent, this.clone()));
            }
        }
        // As a parent: children may have waited for it.
        let me = Parent {
            service: this.service,
            start: this.start,
            clock: this.clock,
        };
        let services = &self.services;
        self.waiting.retain(|(waits_for, child)| {
            if *waits_for != span {
                return true;
            }
            if spec.joins(&me, child) {
                let (caller, callee) = (
                    &services[me.service as usize],
                    &services[child.service as usize],
                );
                found.push(caller, callee, child, later(child.clock, me.clock));
            }
            false
        });
        if !worthless(spec.parent_expires(me.start)) {
            self.parents.insert(span, me);
        }
    }
}

/// An expiry list's value: the keys of its traces.
fn encode_keys(keys: &[Vec<u8>]) -> Vec<u8> {
    let mut w = Writer(Vec::new());
    w.u64(keys.len() as u64);
    for key in keys {
        w.bytes(key);
    }
    w.0
}

fn decode_keys(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut r = Reader(bytes);
    (0..r.u64()?).map(|_| Ok(r.bytes()?.to_vec())).collect()
}

fn trace_key(trace: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + trace.len());
    k.push(TRACE);
    k.extend_from_slice(trace.as_bytes());
    k
}

/// The key recording that trace `key` left the expiry list of minute `at` for a later one.
fn moved_key(at: i64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.extend_from_slice(&moved_prefix(at));
    k.extend_from_slice(key);
    k
}

fn moved_prefix(at: i64) -> [u8; 9] {
    let mut k = [MOVED; 9];
    k[1..].copy_from_slice(&sortable(at));
    k
}

/// The state namespace of traces.
const TRACE: u8 = 0x42;
/// The state namespace of traces that left an expiry list (see [`moved_key`]).
const MOVED: u8 = 0x43;

/// A string cell, `None` when null.
fn text_at(array: &StringArray, row: usize) -> Option<&str> {
    (!array.is_null(row)).then(|| array.value(row))
}

/// The later of two source clocks (a missing one is earlier than any).
fn later(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.max(b)
}

/// The edges found in one batch, as the inner window's rows.
#[derive(Default)]
struct Found {
    time: Vec<i64>,
    caller: StringBuilder,
    callee: StringBuilder,
    error: Int64Builder,
    duration: Int64Builder,
    clock: Int64Builder,
}

impl Found {
    fn push(&mut self, caller: &str, callee: &str, child: &Child, clock: Option<i64>) {
        self.time.push(child.start);
        self.caller.append_value(caller);
        self.callee.append_value(callee);
        self.error.append_value(child.error);
        self.duration.append_value(child.duration);
        self.clock.append_option(clock);
    }
}

/// The service-map operator.
pub struct Edges {
    spec: EdgesSpec,
    window: Window,
    /// The inner window's rows: time, caller, callee, error, duration.
    inner: SchemaRef,
    outputs: Vec<StreamSpec>,
    /// Per partition, a time no expiry timer is earlier than.
    floors: HashMap<u32, i64>,
    /// Expiry lists to write at the end of the call: (partition, minute) → trace keys.
    pending: BTreeMap<(u32, i64), Vec<Vec<u8>>>,
    /// Per partition, the last clock it reached: a trace read from state forgets what is due
    /// by it before new spans join, as if its timer had fired for each span.
    clocks: HashMap<u32, i64>,
}

impl std::fmt::Debug for Edges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edges")
            .field("id", &self.spec.id)
            .finish_non_exhaustive()
    }
}

impl Edges {
    /// An `edges` operator over `input`; `Err` says what is wrong with the configuration.
    pub fn new(spec: EdgesSpec, input: &StreamSpec) -> Result<Self, String> {
        let strings: Vec<&str> = SPAN_COLUMNS
            .iter()
            .copied()
            .chain([spec.service_column.as_str()])
            .collect();
        checked_input(
            input,
            &["trace_id".to_string()],
            "the service map",
            &RequestColumns {
                time: &spec.time_column,
                strings: &strings,
                error: Some(&spec.error_column),
                duration: Some(&spec.duration_column),
            },
        )?;
        let inner = Arc::new(Schema::new(vec![
            Field::new(&spec.time_column, timestamp(), false),
            Field::new("caller_service", DataType::Utf8, false),
            Field::new("callee_service", DataType::Utf8, false),
            Field::new("error", DataType::Int64, false),
            Field::new("duration_ns", DataType::Int64, false),
        ]));
        let stream = StreamSpec {
            name: format!("{}__edges", spec.id),
            table: format!("{}__edges", spec.id),
            schema: Some(iceberg_schema(&inner, &[])?),
            changelog: false,
            key: Vec::new(),
            time_column: Some(spec.time_column.clone()),
            partition: Vec::new(),
            bloom_filter_columns: Vec::new(),
            plain_columns: Vec::new(),
            properties: floe_core::exchange::exchanged_property(input),
        };
        let aggregate = |name: &str, kind| Aggregate {
            name: name.into(),
            kind,
        };
        let mut aggregates = vec![
            aggregate("requests", AggKind::Count),
            aggregate("errors", AggKind::Sum("error".into())),
        ];
        for (name, q) in QUANTILES {
            aggregates.push(aggregate(name, AggKind::Quantile("duration_ns".into(), q)));
        }
        let window = Window::new(
            WindowSpec {
                id: spec.id.clone(),
                kind: WindowKind::Tumbling { size: MINUTE },
                time_column: spec.time_column.clone(),
                out_of_orderness: spec.out_of_orderness,
                allowed_lateness: spec.allowed_lateness,
                idle_after: None,
                key: vec!["caller_service".into(), "callee_service".into()],
                aggregates,
                output: spec.output.clone(),
                late_output: format!("{}__late", spec.id),
                final_output: Some(spec.final_output.clone()),
            },
            &stream,
        )?;
        let outputs = vec![window.outputs()[0].clone(), window.outputs()[2].clone()];
        Ok(Self {
            spec,
            window,
            inner,
            outputs,
            floors: HashMap::new(),
            clocks: HashMap::new(),
            pending: BTreeMap::new(),
        })
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.spec.id.clone(),
            message: message.into(),
        }
    }

    /// Calls the inner window with a context of its own: its rollup rows go out; its late
    /// rows (output 1) are dropped, counted by the window's stats (see the module docs).
    fn run_window(
        &mut self,
        ctx: &mut Context<'_>,
        call: impl FnOnce(&mut Window, &mut Context<'_>) -> OpResult<()>,
    ) -> OpResult<()> {
        let mut inner = ctx.nested();
        call(&mut self.window, &mut inner)?;
        let (emitted, dead) = inner.finish();
        ctx.dead.extend(dead);
        for (output, batch) in emitted {
            match output {
                0 => ctx.emit(0, batch),
                2 => ctx.emit(1, batch),
                _ => {}
            }
        }
        Ok(())
    }

    /// The stored traces of `keys` (empty ones for traces new to state), read in one batched
    /// lookup: a batch's traces are mostly new, and a miss costs RocksDB as much as a hit.
    fn load(&self, ctx: &Context<'_>, p: u32, keys: &[Vec<u8>]) -> OpResult<Vec<Trace>> {
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        ctx.get_many(p, &keys)?
            .into_iter()
            .map(|bytes| match bytes {
                Some(bytes) => Trace::decode(&bytes).map_err(|e| self.invalid(e)),
                None => Ok(Trace::default()),
            })
            .collect()
    }

    /// Writes `trace` back under `key`. A trace is on exactly one expiry list, the one of the
    /// minute after all its spans are due: a trace new to state joins it (written by
    /// [`Self::register_pending`]); one whose spans are now due later moves to a later list,
    /// and the move is recorded under [`MOVED`] so the list it left skips it. A trace that
    /// keeps nothing stays until its list removes it, so it never comes back onto an earlier
    /// list than the one still naming it.
    fn store(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        key: &[u8],
        mut trace: Trace,
    ) -> OpResult<()> {
        let due = trace
            .expires(&self.spec)
            .map(|expires| expires.div_euclid(MINUTE).saturating_add(1) * MINUTE);
        match (trace.timer, due) {
            // New, and nothing worth keeping: every stored trace has a list, so none to delete.
            (None, None) => return Ok(()),
            (Some(on), Some(at)) if at > on => {
                ctx.put(p, &moved_key(on, key), &[])?;
                self.pend(p, at, key);
                trace.timer = Some(at);
            }
            (None, Some(at)) => {
                self.pend(p, at, key);
                trace.timer = Some(at);
            }
            (Some(_), _) => {}
        }
        ctx.put(p, key, &trace.encode())
    }

    /// Puts trace `key` on partition `p`'s expiry list of minute `at`.
    fn pend(&mut self, p: u32, at: i64, key: &[u8]) {
        self.pending.entry((p, at)).or_default().push(key.to_vec());
        let floor = self.floors.entry(p).or_insert(i64::MIN);
        *floor = (*floor).min(at);
    }

    /// The traces that left partition `p`'s expiry lists of minute `at`, forgetting the record.
    fn take_moved(&self, ctx: &mut Context<'_>, p: u32, at: i64) -> OpResult<HashSet<Vec<u8>>> {
        let prefix = moved_prefix(at);
        let end = moved_prefix(at.saturating_add(1));
        let mut keys = Vec::new();
        ctx.scan(p, &prefix, Some(&end), |k, _| {
            keys.push(k.to_vec());
            ControlFlow::Continue(())
        })?;
        let mut moved = HashSet::with_capacity(keys.len());
        for k in keys {
            ctx.delete(p, &k)?;
            moved.insert(k[prefix.len()..].to_vec());
        }
        Ok(moved)
    }

    /// Writes the expiry lists [`Self::store`] started: one timer per (partition, minute) and
    /// call, tagged by its first trace and carrying every trace's key — not a timer per trace.
    /// A list of the same minute and first trace already in state (a trace back after it was
    /// forgotten) is extended, not replaced.
    fn register_pending(&mut self, ctx: &mut Context<'_>) -> OpResult<()> {
        for ((p, at), keys) in std::mem::take(&mut self.pending) {
            let tag = keys[0].clone();
            let mut all = match EXPIRY.value(ctx, p, at, &tag)? {
                Some(bytes) => decode_keys(&bytes).map_err(|e| self.invalid(e))?,
                None => Vec::new(),
            };
            all.extend(keys);
            EXPIRY.register_value(ctx, p, at, &tag, &encode_keys(&all))?;
        }
        Ok(())
    }

    /// The edges rows `rows` of partition `p` make, fed to the window.
    fn on_rows(&mut self, ctx: &mut Context<'_>, p: u32, rows: &RecordBatch) -> OpResult<()> {
        let times = event_times(rows, &self.spec.time_column).map_err(|e| self.invalid(e))?;
        let strings = |name: &str| strings_of(rows, name).map_err(|e| self.invalid(e));
        let [traces, spans, parents] = SPAN_COLUMNS.map(strings);
        let (traces, spans, parents) = (traces?, spans?, parents?);
        let services = strings(&self.spec.service_column)?;
        let spec = &self.spec;
        let names = [
            &*spec.time_column,
            &spec.error_column,
            &spec.duration_column,
        ];
        let values = RequestValues::of(rows, &spec.id, names).map_err(|e| self.invalid(e))?;
        let clocks = rows
            .column_by_name(SOURCE_CLOCK_COLUMN)
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
            .cloned();
        // Each trace's spans (row, start, error, duration), traces in the order they appear.
        type Spans = Vec<(usize, i64, i64, i64)>;
        let mut order: Vec<&str> = Vec::new();
        let mut by_trace: HashMap<&str, Spans, FastHash> = HashMap::default();
        for (row, time) in times.iter().enumerate() {
            let text = |a| text_at(a, row);
            let (Some(trace), Some(span), Some(_)) = (text(&traces), text(&spans), text(&services))
            else {
                // Not part of a trace anyone can join.
                continue;
            };
            if trace.is_empty() || span.is_empty() {
                continue;
            }
            let Some((start, error, duration)) = values.at(ctx, p, rows, (row, *time)) else {
                continue;
            };
            by_trace
                .entry(trace)
                .or_insert_with(|| {
                    order.push(trace);
                    Vec::new()
                })
                .push((row, start, i64::from(error != 0), duration));
        }
        let mut found = Found::default();
        // Storing a trace writes only its own key and its move record, so every trace of the
        // batch can be read up front.
        let keys: Vec<Vec<u8>> = order.iter().map(|trace| trace_key(trace)).collect();
        let stored = self.load(ctx, p, &keys)?;
        for ((trace, key), mut kept) in order.into_iter().zip(keys).zip(stored) {
            if let Some(clock) = self.clocks.get(&p) {
                kept.forget_due(&self.spec, *clock);
            }
            for &(row, start, error, duration) in &by_trace[trace] {
                let this = Child {
                    service: 0,
                    start,
                    duration,
                    error,
                    clock: clocks
                        .as_ref()
                        .and_then(|c| (!c.is_null(row)).then(|| c.value(row))),
                };
                let parent = text_at(&parents, row)
                    .filter(|s| !s.is_empty())
                    .map(compact_id);
                let ids = (compact_id(spans.value(row)), parent);
                kept.arrive(&self.spec, ids, services.value(row), this, &mut found);
            }
            self.store(ctx, p, &key, kept)?;
        }
        self.register_pending(ctx)?;
        if found.time.is_empty() {
            return Ok(());
        }
        let time: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from(std::mem::take(&mut found.time))
                .with_timezone("+00:00"),
        );
        let mut fields: Vec<Field> = self.inner.fields().iter().map(|f| (**f).clone()).collect();
        fields.push(Field::new(SOURCE_CLOCK_COLUMN, DataType::Int64, true));
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            vec![
                time,
                Arc::new(found.caller.finish()),
                Arc::new(found.callee.finish()),
                Arc::new(found.error.finish()),
                Arc::new(found.duration.finish()),
                Arc::new(found.clock.finish()),
            ],
        )
        .map_err(|e| self.invalid(format!("edge rows: {e}")))?;
        self.run_window(ctx, |window, inner| {
            window.on_batch(&StreamBatch::single(0, batch, p), inner)
        })
    }
}

impl Operator for Edges {
    fn id(&self) -> &str {
        &self.spec.id
    }

    fn outputs(&self) -> &[StreamSpec] {
        &self.outputs
    }

    fn on_batch(&mut self, input: &StreamBatch, ctx: &mut Context<'_>) -> OpResult<()> {
        let mut offset = 0;
        for run in &input.runs {
            let rows = input.batch.slice(offset, run.rows);
            offset += run.rows;
            self.on_rows(ctx, run.partition, &rows)?;
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        partition: u32,
        watermark: i64,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        self.run_window(ctx, |window, inner| {
            window.on_watermark(partition, watermark, inner)
        })
    }

    fn on_event_clock(
        &mut self,
        partition: u32,
        max_time: i64,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        // The traces on a list that is due keep nothing worth keeping (their every span is due
        // before the list's minute): they are removed unread, but for those that moved on.
        let from = self.floors.get(&partition).copied().unwrap_or(i64::MIN);
        let mut moved: Option<(i64, HashSet<Vec<u8>>)> = None;
        for (at, _, list) in EXPIRY.take_due_values(ctx, partition, from, max_time)? {
            if moved.as_ref().is_none_or(|(of, _)| *of != at) {
                moved = Some((at, self.take_moved(ctx, partition, at)?));
            }
            let left = &moved.as_ref().expect("just set").1;
            for key in decode_keys(&list).map_err(|e| self.invalid(e))? {
                if !left.contains(&key) {
                    ctx.delete(partition, &key)?;
                }
            }
        }
        self.register_pending(ctx)?;
        self.floors
            .insert(partition, max_time.saturating_add(1).max(from));
        self.clocks.insert(partition, max_time);
        self.run_window(ctx, |window, inner| {
            window.on_event_clock(partition, max_time, inner)
        })
    }

    fn on_barrier(&mut self, ctx: &mut Context<'_>) -> OpResult<()> {
        self.run_window(ctx, |window, inner| window.on_barrier(inner))
    }

    fn on_restore(&mut self, partition: u32, ctx: &mut Context<'_>) -> OpResult<()> {
        self.floors.remove(&partition);
        self.clocks.remove(&partition);
        let mut inner = ctx.nested();
        self.window.on_restore(partition, &mut inner)
    }

    fn forget(&mut self) {
        self.floors.clear();
        self.clocks.clear();
        self.window.forget();
    }

    fn watermarks(&self) -> Vec<(u32, i64)> {
        self.window.watermarks()
    }

    fn final_frontiers(&self) -> Vec<(u32, i64)> {
        self.window.final_frontiers()
    }

    fn fingerprint(&self) -> Option<String> {
        Some(self.spec.fingerprint())
    }

    fn stats(&self) -> OperatorStats {
        self.window.stats()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::ControlFlow;

    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, TimestampMicrosecondType};
    use floe_state::StateStore;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    const S: i64 = 1_000_000;
    /// 2025-10-09T08:53:20Z.
    const T0: i64 = 1_760_000_000 * S;

    fn input() -> StreamSpec {
        let field = |id, name, t| Arc::new(NestedField::optional(id, name, Type::Primitive(t)));
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                field(1, "ts", PrimitiveType::Timestamptz),
                field(2, "trace_id", PrimitiveType::String),
                field(3, "span_id", PrimitiveType::String),
                field(4, "parent_span_id", PrimitiveType::String),
                field(5, "service_name", PrimitiveType::String),
                field(6, "error", PrimitiveType::Int),
                field(7, "duration_ns", PrimitiveType::Long),
            ])
            .build()
            .unwrap();
        StreamSpec {
            time_column: Some("ts".into()),
            properties: vec![
                (floe_core::exchange::EXCHANGED_FROM.into(), "x".into()),
                (floe_core::exchange::EXCHANGED_BY.into(), "trace_id".into()),
            ],
            ..StreamSpec::append("by_trace", "by_trace", schema)
        }
    }

    fn spec() -> EdgesSpec {
        EdgesSpec {
            id: "edges".into(),
            time_column: "ts".into(),
            out_of_orderness: 5 * S,
            allowed_lateness: 30 * S,
            join_window: 120 * S,
            service_column: "service_name".into(),
            error_column: "error".into(),
            duration_column: "duration_ns".into(),
            output: "service_edges".into(),
            final_output: "service_edges_final".into(),
        }
    }

    /// A span: start µs, trace, span, parent ("" for a root), service, error, duration ns.
    #[derive(Debug, Clone)]
    struct Span {
        start: i64,
        trace: String,
        span: String,
        parent: String,
        service: String,
        error: i32,
        duration: i64,
    }

    fn batch(rows: &[(Span, Option<i64>)]) -> StreamBatch {
        let schema = Schema::new(vec![
            Field::new("ts", timestamp(), true),
            Field::new("trace_id", DataType::Utf8, true),
            Field::new("span_id", DataType::Utf8, true),
            Field::new("parent_span_id", DataType::Utf8, true),
            Field::new("service_name", DataType::Utf8, true),
            Field::new("error", DataType::Int32, true),
            Field::new("duration_ns", DataType::Int64, true),
            Field::new(SOURCE_CLOCK_COLUMN, DataType::Int64, true),
        ]);
        let text = |f: fn(&Span) -> &str| -> ArrayRef {
            Arc::new(StringArray::from(
                rows.iter().map(|(s, _)| f(s)).collect::<Vec<_>>(),
            ))
        };
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                TimestampMicrosecondArray::from(rows.iter().map(|r| r.0.start).collect::<Vec<_>>())
                    .with_timezone("+00:00"),
            ),
            text(|s| &s.trace),
            text(|s| &s.span),
            text(|s| &s.parent),
            text(|s| &s.service),
            Arc::new(arrow_array::Int32Array::from(
                rows.iter().map(|r| r.0.error).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.0.duration).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
        ];
        StreamBatch::single(
            0,
            RecordBatch::try_new(Arc::new(schema), columns).unwrap(),
            0,
        )
    }

    /// (minute, caller, callee) → (requests, errors, p99 ns).
    type Rows = BTreeMap<(i64, String, String), (i64, i64, f64)>;

    fn collect(emitted: Vec<(usize, StreamBatch)>, out: &mut Rows) {
        for (output, b) in emitted {
            assert!(output <= 1, "rollup rows and final rows leave the operator");
            let b = b.batch;
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
            let starts = b
                .column_by_name("window_start")
                .unwrap()
                .as_primitive::<TimestampMicrosecondType>();
            let p99 = b
                .column_by_name("p99_ns")
                .unwrap()
                .as_primitive::<arrow_array::types::Float64Type>();
            for r in 0..b.num_rows() {
                let key = (
                    starts.value(r).div_euclid(MINUTE),
                    text("caller_service", r),
                    text("callee_service", r),
                );
                let row = (int("requests", r), int("errors", r), p99.value(r));
                if output == 1 {
                    // A final row is the minute's last image, once.
                    assert_eq!(out.get(&key), Some(&row), "final row {key:?}");
                } else {
                    out.insert(key, row);
                }
            }
        }
    }

    /// Runs `spans` (in arrival order) through in chunks of `size`, the exchange's clock
    /// after each chunk; with `restart`, a fresh operator restores the state halfway.
    /// Returns the rows and the late edges counted.
    fn run(spans: &[Span], size: usize, restart: bool) -> (Rows, u64) {
        let dir = std::env::temp_dir().join(format!(
            "floe-edges-{}-{}-{size}-{restart}",
            std::process::id(),
            spans.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let names = |p: u32| format!("x/{p}");
        let mut op = Edges::new(spec(), &input()).unwrap();
        let mut out = Rows::new();
        let mut clock: Option<i64> = None;
        let mut late = 0;
        let chunks = spans.len().div_ceil(size);
        for (i, chunk) in spans.chunks(size).enumerate() {
            if restart && i == chunks / 2 {
                late += op.stats().late_rows;
                op = Edges::new(spec(), &input()).unwrap();
                let mut ctx = Context::new(Some(&mut store), 0, &names);
                op.on_restore(0, &mut ctx).unwrap();
            }
            // Each row carries the clock before it (one source).
            let rows: Vec<(Span, Option<i64>)> = chunk
                .iter()
                .map(|s| {
                    let before = clock;
                    clock = clock.max(Some(s.start));
                    (s.clone(), before)
                })
                .collect();
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            op.on_batch(&batch(&rows), &mut ctx).unwrap();
            op.on_event_clock(0, clock.unwrap(), &mut ctx).unwrap();
            let (emitted, dead) = ctx.finish();
            assert!(dead.is_empty());
            collect(emitted, &mut out);
        }
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        op.on_event_clock(0, clock.unwrap() + 3600 * S, &mut ctx)
            .unwrap();
        collect(ctx.finish().0, &mut out);
        late += op.stats().late_rows;
        // Everything waiting was forgotten once the clock passed it, and every move between
        // expiry lists with it.
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        for namespace in [TRACE, MOVED] {
            let mut left = 0;
            ctx.scan(0, &[namespace], Some(&[namespace + 1]), |_, _| {
                left += 1;
                ControlFlow::Continue(())
            })
            .unwrap();
            assert_eq!(left, 0, "entries of namespace {namespace:#x} left in state");
        }
        drop(ctx);
        let _ = std::fs::remove_dir_all(&dir);
        (out, late)
    }

    fn lcg(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut state = seed;
        move |n| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        }
    }

    const SERVICES: [&str; 4] = ["frontend", "checkout", "payments", "stock"];

    /// Traces over ten minutes: frontend → checkout → payments | stock, each call a CLIENT
    /// span of the caller and a SERVER span of the callee, some of them failed; every trace's
    /// spans arrive shuffled, a few seconds apart at most.
    fn traces(seed: u64) -> Vec<Span> {
        let mut rand = lcg(seed);
        let mut spans = Vec::new();
        for t in 0..400 {
            let trace = format!("{t:032x}");
            let start = T0 + t * 1_500_000 + rand(1_000_000) as i64;
            let mut next = 0;
            let mut span =
                |parent: &str, service: &str, at: i64, rand: &mut dyn FnMut(u64) -> u64| {
                    next += 1;
                    let s = Span {
                        start: at,
                        trace: trace.clone(),
                        span: format!("{next:016x}"),
                        parent: parent.to_string(),
                        service: service.to_string(),
                        error: i32::from(rand(10) == 0),
                        duration: 1_000_000 + rand(50_000_000) as i64,
                    };
                    let id = s.span.clone();
                    (s, id)
                };
            let (root, root_id) = span("", SERVICES[0], start, &mut rand);
            let mut trace_spans = vec![root];
            let (client, client_id) = span(&root_id, SERVICES[0], start + 10, &mut rand);
            trace_spans.push(client);
            let (server, server_id) = span(&client_id, SERVICES[1], start + 20, &mut rand);
            trace_spans.push(server);
            let callee = SERVICES[2 + rand(2) as usize];
            let (client2, client2_id) = span(&server_id, SERVICES[1], start + 30, &mut rand);
            trace_spans.push(client2);
            let (server2, _) = span(&client2_id, callee, start + 40, &mut rand);
            trace_spans.push(server2);
            // Shuffled within the trace.
            for i in (1..trace_spans.len()).rev() {
                trace_spans.swap(i, rand(i as u64 + 1) as usize);
            }
            spans.extend(trace_spans);
        }
        spans
    }

    /// The edges by brute force: every child of another service's parent in the same trace.
    fn reference(spans: &[Span]) -> BTreeMap<(i64, String, String), (i64, i64)> {
        let mut out: BTreeMap<(i64, String, String), (i64, i64)> = BTreeMap::new();
        for c in spans {
            for p in spans {
                if p.trace == c.trace && p.span == c.parent && p.service != c.service {
                    let e = out
                        .entry((
                            c.start.div_euclid(MINUTE),
                            p.service.clone(),
                            c.service.clone(),
                        ))
                        .or_default();
                    e.0 += 1;
                    e.1 += i64::from(c.error);
                }
            }
        }
        out
    }

    #[test]
    fn edges_equal_a_brute_force_join_whatever_the_batching_and_restarts() {
        let spans = traces(7);
        let expected = reference(&spans);
        assert!(expected.len() > 10, "{expected:?}");
        let (first, late) = run(&spans, 1, false);
        assert_eq!(late, 0);
        let counts: BTreeMap<_, _> = first.iter().map(|(k, v)| (k.clone(), (v.0, v.1))).collect();
        assert_eq!(counts, expected);
        for (size, restart) in [(7, false), (64, true), (1000, false), (13, true)] {
            let (rows, late) = run(&spans, size, restart);
            assert_eq!(late, 0);
            assert_eq!(rows, first, "chunks of {size}, restart {restart}");
        }
    }

    #[test]
    fn a_parent_arriving_after_its_childs_minute_is_final_makes_no_row() {
        let span = |start, id: &str, parent: &str, service: &str| Span {
            start,
            trace: "t".into(),
            span: id.into(),
            parent: parent.into(),
            service: service.into(),
            error: 0,
            duration: 1,
        };
        // The child at T0; two minutes of other traffic; then its parent.
        let mut spans = vec![span(T0, "c", "p", "checkout")];
        for i in 0..12 {
            spans.push(Span {
                trace: format!("other{i}"),
                ..span(T0 + i * 10 * S, "x", "", "frontend")
            });
        }
        spans.push(span(T0 - S, "p", "", "frontend"));
        // A child joined in time, for contrast.
        spans.push(span(T0 + 125 * S, "c2", "x", "checkout"));
        spans.push(Span {
            trace: "other11".into(),
            ..span(T0 + 126 * S, "c3", "x", "payments")
        });
        let (rows, late) = run(&spans, 1, false);
        assert_eq!(late, 0, "the waiting child was forgotten, not joined late");
        let callers: Vec<_> = rows.keys().map(|k| (k.1.as_str(), k.2.as_str())).collect();
        assert_eq!(callers, vec![("frontend", "payments")], "{rows:?}");
        assert!(rows.keys().all(|k| k.0 > T0.div_euclid(MINUTE)));
    }

    #[test]
    fn a_trace_is_one_state_entry_and_a_batch_one_expiry_list_per_minute() {
        let spans = traces(11);
        let dir = std::env::temp_dir().join(format!("floe-edges-layout-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let names = |p: u32| format!("x/{p}");
        let mut op = Edges::new(spec(), &input()).unwrap();
        let rows: Vec<(Span, Option<i64>)> = spans.iter().map(|s| (s.clone(), None)).collect();
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        op.on_batch(&batch(&rows), &mut ctx).unwrap();
        let count = |ctx: &mut Context<'_>, namespace: u8| {
            let mut n = 0;
            ctx.scan(0, &[namespace], Some(&[namespace + 1]), |_, _| {
                n += 1;
                ControlFlow::Continue(())
            })
            .unwrap();
            n
        };
        assert_eq!(count(&mut ctx, TRACE), 400, "one entry per trace");
        let lists = EXPIRY.count(&mut ctx, 0).unwrap();
        // 400 traces over ten minutes, in one batch: one expiry list per minute.
        assert!((10..=12).contains(&lists), "{lists} expiry lists");
        drop(ctx);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_span_that_came_after_its_traces_timer_was_set_is_kept_until_it_is_due() {
        let span = |start, trace: &str, id: &str, parent: &str, service: &str| Span {
            start,
            trace: trace.into(),
            span: id.into(),
            parent: parent.into(),
            service: service.into(),
            error: 0,
            duration: 1,
        };
        // The trace's first span puts it on the expiry list of the minute after that span is
        // due (T0 + 195 s → T0 + 220 s); a second span of the trace comes later and is due
        // later, so the list fires with it still kept, the trace joins a later list, and the
        // second span's child, after the first list fired, still joins it.
        let mut spans = vec![span(T0, "t", "p", "", "frontend")];
        let filler = |at: i64| span(at, &format!("f{at}"), "f", "", "stock");
        spans.extend((1..15).map(|i| filler(T0 + i * 10 * S)));
        spans.push(span(T0 + 150 * S, "t", "q", "", "checkout"));
        spans.extend((0..8).map(|i| filler(T0 + 151 * S + i * 10 * S)));
        spans.push(span(T0 + 225 * S, "t", "r", "q", "payments"));
        let (rows, late) = run(&spans, 1, false);
        assert_eq!(late, 0);
        let edges: Vec<_> = rows.keys().map(|k| (k.1.as_str(), k.2.as_str())).collect();
        assert_eq!(edges, vec![("checkout", "payments")], "{rows:?}");
    }

    #[test]
    fn a_trace_round_trips_in_a_third_of_the_old_layout_with_only_the_services_it_keeps() {
        // Hex ids are halved, anything else is kept as it is, and the two never collide.
        assert_eq!(compact_id("00ff"), vec![0, 0x00, 0xff]);
        assert_eq!(compact_id("00FF"), b"\x0100FF".to_vec());
        assert_eq!(compact_id("abc"), b"\x01abc".to_vec());
        assert_ne!(compact_id("6162"), compact_id("ab"));
        let spec = spec();
        let mut trace = Trace::default();
        let mut found = Found::default();
        let child = |start, clock| Child {
            service: 0,
            start,
            duration: 42_000,
            error: 1,
            clock,
        };
        let ids = |span: &str, parent: Option<&str>| (compact_id(span), parent.map(compact_id));
        trace.arrive(
            &spec,
            ids("a1", None),
            "gone",
            child(T0 - 600 * S, None),
            &mut found,
        );
        trace.arrive(
            &spec,
            ids("b2", Some("zz")),
            "checkout",
            child(T0, Some(T0 - S)),
            &mut found,
        );
        trace.arrive(
            &spec,
            ids("c3", Some("b2")),
            "payments",
            child(T0 + S, None),
            &mut found,
        );
        trace.timer = Some(T0 + 300 * S);
        trace.forget_due(&spec, T0 - 60 * S);
        assert_eq!(trace.services.len(), 3, "{:?}", trace.services);
        let bytes = trace.encode();
        let back = Trace::decode(&bytes).unwrap();
        assert_eq!(
            back.services,
            vec!["checkout", "payments"],
            "the forgotten span's service left"
        );
        let named = |t: &Trace| {
            let parents: Vec<_> = t
                .parents
                .iter()
                .map(|(id, k)| {
                    (
                        id.clone(),
                        t.services[k.service as usize].clone(),
                        k.start,
                        k.clock,
                    )
                })
                .collect();
            let waiting: Vec<_> = t
                .waiting
                .iter()
                .map(|(id, k)| {
                    let service = t.services[k.service as usize].clone();
                    (id.clone(), service, k.start, k.duration, k.error, k.clock)
                })
                .collect();
            (t.timer, parents, waiting)
        };
        assert_eq!(named(&back), named(&trace));
        assert_eq!(found.time, vec![T0 + S], "c3 joined b2");
        // Two parents and a waiting child in under 80 bytes.
        assert!(bytes.len() < 80, "{} bytes", bytes.len());
        assert!(Trace::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn a_span_on_one_partition_of_another_exchange_is_refused() {
        let mut by_service = input();
        by_service.properties[1].1 = "service_name".into();
        let e = Edges::new(spec(), &by_service).unwrap_err();
        assert!(e.contains("exchange by trace_id"), "{e}");
        let mut plain = input();
        plain.properties.clear();
        let e = Edges::new(spec(), &plain).unwrap_err();
        assert!(e.contains("put an exchange keyed by trace_id"), "{e}");
    }
}
