//! Anomaly scoring at scale: `cargo bench -p floe-ops --bench series`.
//!
//! The `anomaly` operator (`kind = "anomaly"`, default settings: warm-up 30 minutes, hour-of-day
//! seasonality, a TTL of a day) on `FLOE_BENCH_SERIES` live series (default 100,000), each
//! with two gauge points a minute (`max(value)` per minute), for `FLOE_BENCH_MINUTES` minutes
//! of event time (default 45), in 8,192-row batches as they come out of an exchange, with a
//! checkpoint (the state's epoch sealed and handed over) every 10 minutes of event time — on
//! one thread, over RocksDB keyed state, as the runtime drives it.
//!
//! Baseline in the same run: a 1-minute tumbling window with the same key and aggregate over
//! the same batches — the rollup a user would write anyway. Reported: series-minutes per
//! CPU-second of the process (RocksDB's threads included) for each, their ratio, and state
//! bytes per live series: the model's entries (key and value, exact) and RocksDB's estimate
//! of everything the operator holds. A second, smaller phase (`FLOE_BENCH_SEASON_SERIES`,
//! default 1,000, for 25 hours) measures the model's entries once the hour-of-day offsets
//! are learned, from a series' second day on.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow_array::{TimestampMicrosecondArray, builder::StringBuilder};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use floe_core::exchange::{EXCHANGED_BY, EXCHANGED_FROM, SOURCE_CLOCK_COLUMN};
use floe_core::{StreamBatch, StreamSpec};
use floe_ops::aggregate::parse_aggregate;
use floe_ops::anomaly::DEFAULTS;
use floe_ops::series::{Model, SeriesOperator, SeriesSpec, parse_measure};
use floe_ops::window::{Window, WindowKind, WindowSpec};
use floe_ops::{Context, Operator};
use floe_state::StateStore;
use iceberg::spec::{NestedField, PrimitiveType, Type};

// The allocator the `floe` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const S: i64 = 1_000_000;
const MINUTE: i64 = 60 * S;
/// 2025-10-09T08:53:00Z, a minute's start.
const T0: i64 = 1_759_999_980 * S;
const BATCH: usize = 8192;
/// Event time between checkpoints.
const CHECKPOINT: i64 = 10 * MINUTE;
/// The state store's memory budget (the runtime's default).
const MEMORY: usize = 64 << 20;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// The exchanged input: an event time, the series' name and a gauge value.
fn input() -> StreamSpec {
    let field = |id, name, t| Arc::new(NestedField::optional(id, name, Type::Primitive(t)));
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![
            field(1, "ts", PrimitiveType::Timestamptz),
            field(2, "series", PrimitiveType::String),
            field(3, "value", PrimitiveType::Double),
        ])
        .build()
        .unwrap();
    StreamSpec {
        time_column: Some("ts".into()),
        properties: vec![
            (EXCHANGED_FROM.into(), "points".into()),
            (EXCHANGED_BY.into(), "series".into()),
        ],
        ..StreamSpec::append("points", "points", schema)
    }
}

fn arrow_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new("series", DataType::Utf8, true),
        Field::new("value", DataType::Float64, true),
        Field::new(SOURCE_CLOCK_COLUMN, DataType::Int64, true),
    ]))
}

/// The input of `minutes` minutes of `series` series, two points each a minute (at :00 and
/// :30), as 8,192-row batches with the source clock of the rows before each; the value is a
/// noisy level of the series' own. The series names are one array, sliced.
fn workload(series: usize, minutes: i64) -> Vec<(StreamBatch, i64)> {
    let mut names = StringBuilder::new();
    for _ in 0..2 {
        for s in 0..series {
            names.append_value(format!("host-{s:06}/disk.utilization"));
        }
    }
    let names: ArrayRef = Arc::new(names.finish());
    let schema = arrow_schema();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut noise = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::new();
    let mut clock = i64::MIN;
    for m in 0..minutes {
        let times: Vec<i64> = (0..2 * series)
            .map(|i| T0 + m * MINUTE + if i < series { 0 } else { 30 * S })
            .collect();
        let values: Vec<f64> = (0..2 * series)
            .map(|i| 0.2 + 0.5 * (i % series) as f64 / series as f64 + 0.01 * noise())
            .collect();
        let mut clocks = Vec::with_capacity(2 * series);
        for &t in &times {
            clocks.push((clock != i64::MIN).then_some(clock));
            clock = clock.max(t);
        }
        let minute = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(TimestampMicrosecondArray::from(times).with_timezone("+00:00")),
                names.clone(),
                Arc::new(Float64Array::from(values)),
                Arc::new(Int64Array::from(clocks)),
            ],
        )
        .unwrap();
        let mut offset = 0;
        while offset < minute.num_rows() {
            let len = BATCH.min(minute.num_rows() - offset);
            let batch = minute.slice(offset, len);
            offset += len;
            let last = T0 + m * MINUTE + if offset > series { 30 * S } else { 0 };
            out.push((StreamBatch::single(0, batch, 0), last));
        }
    }
    out
}

fn anomaly(id: &str) -> SeriesSpec {
    SeriesSpec {
        id: id.into(),
        time_column: "ts".into(),
        out_of_orderness: 5 * S,
        allowed_lateness: 30 * S,
        key: vec!["series".into()],
        measures: vec![parse_measure("value", "max(value)").unwrap()],
        model: Model::Anomaly(DEFAULTS),
        output: format!("{id}_anomalies"),
        scores_output: format!("{id}_scores"),
        late_output: format!("{id}_late"),
    }
}

fn rollup() -> WindowSpec {
    WindowSpec {
        id: "rollup".into(),
        kind: WindowKind::Tumbling { size: MINUTE },
        time_column: "ts".into(),
        out_of_orderness: 5 * S,
        allowed_lateness: 30 * S,
        idle_after: None,
        key: vec!["series".into()],
        aggregates: vec![parse_aggregate("value", "max(value)").unwrap()],
        output: "rollup".into(),
        late_output: "rollup_late".into(),
        final_output: None,
    }
}

/// CPU-seconds of this process so far (every thread: RocksDB's too), from `/proc`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

struct Run {
    cpu: f64,
    wall: f64,
    rows_out: usize,
    /// Bytes of the operator's series entries (`0x40 …`), keys and values.
    model_bytes: u64,
    /// RocksDB's estimate of everything held (on disk and in memtables).
    store_bytes: u64,
}

/// Drives `op` over `batches` as the runtime does: each batch, then the exchange's clock;
/// every 10 minutes of event time a checkpoint barrier seals the state's epoch and hands its
/// changes over.
fn drive(op: &mut dyn Operator, batches: &[(StreamBatch, i64)], name: &str) -> Run {
    let dir = std::env::temp_dir().join(format!("floe-bench-series-{name}-{}", std::process::id()));
    let mut store = StateStore::open(&dir, MEMORY).unwrap();
    let names = |p: u32| format!("points/{p}");
    let mut rows_out = 0;
    let mut next_checkpoint = T0 + CHECKPOINT;
    let (cpu, began) = (cpu_seconds(), Instant::now());
    for (batch, clock) in batches {
        let barrier = *clock >= next_checkpoint;
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        op.on_batch(batch, &mut ctx).unwrap();
        op.on_event_clock(0, *clock, &mut ctx).unwrap();
        if barrier {
            op.on_barrier(&mut ctx).unwrap();
        }
        let (emitted, dead) = ctx.finish();
        assert!(dead.is_empty(), "{name}: dead letters");
        rows_out += emitted
            .iter()
            .map(|(_, b)| b.batch.num_rows())
            .sum::<usize>();
        if barrier {
            let epoch = store.seal().unwrap();
            assert!(!store.changes(epoch).is_empty());
            store.release(epoch).unwrap();
            next_checkpoint += CHECKPOINT;
        }
    }
    let (cpu, wall) = (cpu_seconds() - cpu, began.elapsed().as_secs_f64());
    let mut model_bytes = 0;
    store
        .scan(0, 0, &[0x40], Some(&[0x41]), |k, v| {
            model_bytes += (k.len() + v.len()) as u64;
            ControlFlow::Continue(())
        })
        .unwrap();
    let store_bytes = store.size().1;
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        cpu,
        wall,
        rows_out,
        model_bytes,
        store_bytes,
    }
}

fn main() {
    let series = knob("FLOE_BENCH_SERIES", 100_000);
    let minutes = knob("FLOE_BENCH_MINUTES", 45) as i64;
    let season_series = knob("FLOE_BENCH_SEASON_SERIES", 1_000);
    let input = input();

    let batches = workload(series, minutes);
    let judged = (series as i64 * minutes) as f64;
    println!(
        "{series} series × {minutes} minutes, 2 points per series-minute ({} rows), one thread",
        2 * series as i64 * minutes
    );

    let mut window = Window::new(rollup(), &input).unwrap();
    let base = drive(&mut window, &batches, "rollup");
    let mut model = SeriesOperator::new(anomaly("anomaly"), &input).unwrap();
    let scored = drive(&mut model, &batches, "anomaly");
    drop(batches);

    let rate = |r: &Run| judged / r.cpu;
    println!(
        "{:<42} {:>14} {:>10} {:>10} {:>16}",
        "", "series-min/CPU-s", "CPU-s", "wall s", "rows emitted"
    );
    for (label, r) in [
        ("(a) 1-minute window, max(value) (baseline)", &base),
        ("(b) anomaly, max(value), default settings", &scored),
    ] {
        println!(
            "{label:<42} {:>16.0} {:>10.2} {:>10.2} {:>16}",
            rate(r),
            r.cpu,
            r.wall,
            r.rows_out
        );
    }
    println!("(b)/(a) = {:.2}", rate(&scored) / rate(&base));
    println!(
        "one core judges {:.1} M series at one minute's resolution ({:.0} series-minutes/s)",
        rate(&scored) * 60.0 / 1e6,
        rate(&scored)
    );
    println!(
        "state per live series: model entries {:.1} bytes; RocksDB estimate, everything the \
         anomaly operator holds {:.1} bytes (the window: {:.1})",
        scored.model_bytes as f64 / series as f64,
        scored.store_bytes as f64 / series as f64,
        base.store_bytes as f64 / series as f64,
    );

    // A day and an hour, so the hour-of-day offsets are learned.
    let day = 25 * 60;
    let batches = workload(season_series, day);
    let mut model = SeriesOperator::new(anomaly("season"), &input).unwrap();
    let seasonal = drive(&mut model, &batches, "season");
    println!(
        "after a day ({season_series} series × {day} minutes): model entries {:.1} bytes per \
         series, {:.0} series-minutes/CPU-s",
        seasonal.model_bytes as f64 / season_series as f64,
        (season_series as i64 * day) as f64 / seasonal.cpu
    );
}
