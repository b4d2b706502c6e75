//! Final minutes: the counting under the per-minute operators (`slo`, `regression`, the
//! series operators `anomaly` and `forecast`, and `alerts`).
//!
//! Each reads rows back from an exchange (or from one partition), aggregates them per minute
//! of event time and key, and then evaluates each minute **once**, when it is final.
//! [`Minutes`] is that aggregation: a tumbling one-minute [`Window`] without allowed lateness
//! whose clock runs the operator's allowed lateness behind, so a minute closes at `watermark ≥
//! end + allowed_lateness` and is emitted once, final; rows later than that come back as late
//! (row, watermark) pairs for the operator's late table.
//!
//! The caller feeds it rows built by [`inner_rows`]: the time column, the caller's key and
//! aggregate columns, the index of the input row ([`ROW_COLUMN`], so late rows are reported
//! as the input's) and the exchange's source clock. [`require_exchange_by`] is the check the
//! operators make of their input, and [`per_minute_hooks`] their shared [`Operator`] hooks.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::exchange::{SOURCE_CLOCK_COLUMN, exchange_key, is_exchanged, is_one_partition};
use floe_core::{StreamBatch, StreamSpec};

use crate::aggregate::Aggregate;
use crate::codec::integer_at;
use crate::window::{Window, WindowKind, WindowSpec, iceberg_schema, late_rows};
use crate::{Context, OpResult, Operator, OperatorStats};

/// The [`Operator`] hooks every per-minute operator shares, inside its `impl Operator`: `id`
/// and `outputs` (its `spec.id` and `outputs`), `on_batch` (each partition's rows through
/// `self.$prepare(ctx, partition, &rows)` into its `minutes`, then the minutes that closed
/// through `self.$evaluate(ctx, partition, Some(&rows), closed)`), `on_watermark` and
/// `on_event_clock` (the clock into `minutes`, then `$evaluate` without rows), `watermarks`
/// and `stats` (the minutes') and `fingerprint` (its spec's). Restoring, forgetting and the
/// final frontiers are each operator's own.
macro_rules! per_minute_hooks {
    ($prepare:ident, $evaluate:ident) => {
        fn id(&self) -> &str {
            &self.spec.id
        }

        fn outputs(&self) -> &[floe_core::StreamSpec] {
            &self.outputs
        }

        fn on_batch(
            &mut self,
            input: &floe_core::StreamBatch,
            ctx: &mut $crate::Context<'_>,
        ) -> $crate::OpResult<()> {
            if input.batch.schema().fields().len() < self.input.fields().len() {
                return Err(self.invalid("rows without the input's columns"));
            }
            for (p, rows) in input.slices() {
                let prepared = self.$prepare(ctx, p, &rows)?;
                let closed = self.minutes.on_rows(ctx, p, prepared)?;
                self.$evaluate(ctx, p, Some(&rows), closed)?;
            }
            Ok(())
        }

        fn on_watermark(
            &mut self,
            partition: u32,
            watermark: i64,
            ctx: &mut $crate::Context<'_>,
        ) -> $crate::OpResult<()> {
            let closed = self.minutes.on_watermark(ctx, partition, watermark)?;
            self.$evaluate(ctx, partition, None, closed)
        }

        fn on_event_clock(
            &mut self,
            partition: u32,
            max_time: i64,
            ctx: &mut $crate::Context<'_>,
        ) -> $crate::OpResult<()> {
            let closed = self.minutes.on_event_clock(ctx, partition, max_time)?;
            self.$evaluate(ctx, partition, None, closed)
        }

        fn watermarks(&self) -> Vec<(u32, i64)> {
            self.minutes.watermarks()
        }

        fn fingerprint(&self) -> Option<String> {
            Some(self.spec.fingerprint())
        }

        fn stats(&self) -> $crate::OperatorStats {
            self.minutes.stats()
        }
    };
}
pub(crate) use per_minute_hooks;

/// One minute, µs.
pub(crate) const MINUTE: i64 = 60_000_000;

/// The inner rows' column holding the index of their input row.
pub(crate) const ROW_COLUMN: &str = "row";

/// Refuses `input` unless it is read back from an exchange keyed by a subset of `allowed`
/// (or all of its rows are in one partition anyway): `what` needs every row of such a key in
/// one partition.
pub(crate) fn require_exchange_by(
    input: &StreamSpec,
    allowed: &[String],
    what: &str,
) -> Result<(), String> {
    if is_one_partition(input) {
        return Ok(());
    }
    match exchange_key(input) {
        Some(key) if key.iter().all(|k| allowed.contains(k)) => Ok(()),
        Some(key) => Err(format!(
            "stream {} is exchanged by {}: {what} needs all rows of one {} in one \
             partition, so exchange by {} alone",
            input.name,
            key.join(", "),
            allowed[0],
            allowed.join(" or by ")
        )),
        None if is_exchanged(input) => Err(format!(
            "stream {} was exchanged by an older Floe that did not record its key: restart the \
             exchange's job first",
            input.name
        )),
        None => Err(format!(
            "stream {} is not read back from an exchange: {what} needs all rows of one {} in \
             one partition; put an exchange keyed by {} before it",
            input.name, allowed[0], allowed[0]
        )),
    }
}

/// The columns an operator over exchanged requests reads, by the names it was given.
pub(crate) struct RequestColumns<'a> {
    /// The event time.
    pub time: &'a str,
    /// Columns that must be strings (service, endpoint, version, ids).
    pub strings: &'a [&'a str],
    /// The column that is non-zero for a failure: an integer or a boolean.
    pub error: Option<&'a str>,
    /// The duration in ns: an integer.
    pub duration: Option<&'a str>,
}

/// The Arrow schema of `input` and the type of its time column, once it is what `what` needs:
/// an append stream, read back from an exchange keyed by a subset of `keys`
/// ([`require_exchange_by`]), timed by its own time column, and holding `columns` of the
/// right types.
pub(crate) fn checked_input(
    input: &StreamSpec,
    keys: &[String],
    what: &str,
    columns: &RequestColumns<'_>,
) -> Result<(SchemaRef, DataType), String> {
    if input.changelog {
        return Err(format!(
            "stream {} is a changelog; {what} reads an append stream",
            input.name
        ));
    }
    require_exchange_by(input, keys, what)?;
    if input.time_column.as_deref() != Some(columns.time) {
        return Err(format!(
            "stream {} is read back from an exchange, whose rows carry the clock of its time \
             column {:?}: {what} uses that column, not {}",
            input.name, input.time_column, columns.time
        ));
    }
    let iceberg = input
        .schema
        .as_ref()
        .ok_or_else(|| format!("the columns of stream {} are not known yet", input.name))?;
    let arrow: SchemaRef =
        Arc::new(iceberg::arrow::schema_to_arrow_schema(iceberg).map_err(|e| e.to_string())?);
    let field = |name: &str| {
        arrow
            .field_with_name(name)
            .map(|f| f.data_type().clone())
            .map_err(|_| format!("stream {} has no column {name}", input.name))
    };
    let time_type = field(columns.time)?;
    for column in columns.strings {
        if !matches!(field(column)?, DataType::Utf8 | DataType::LargeUtf8) {
            return Err(format!("column {column} is not a string"));
        }
    }
    if let Some(column) = columns.error {
        let ty = field(column)?;
        if !(ty.is_integer() || ty == DataType::Boolean) {
            return Err(format!(
                "the error column {column} is {ty}, not an integer or a boolean"
            ));
        }
    }
    if let Some(column) = columns.duration
        && !field(column)?.is_integer()
    {
        return Err(format!(
            "the duration column {column} is not an integer of nanoseconds"
        ));
    }
    Ok((arrow, time_type))
}

/// Column `name` of `rows` as strings.
pub(crate) fn strings_of(rows: &RecordBatch, name: &str) -> Result<StringArray, String> {
    let column = rows
        .column_by_name(name)
        .ok_or_else(|| format!("no column {name}"))?;
    let column = arrow_cast::cast(column, &DataType::Utf8).map_err(|e| e.to_string())?;
    Ok(column
        .as_any()
        .downcast_ref::<StringArray>()
        .cloned()
        .expect("cast to Utf8"))
}

/// Column `name` of `rows` as 64-bit integers (a boolean as 0 or 1), or as it is where it
/// cannot be cast.
pub(crate) fn integers_of(rows: &RecordBatch, name: &str) -> Result<ArrayRef, String> {
    rows.column_by_name(name)
        .map(|c| arrow_cast::cast(c, &DataType::Int64).unwrap_or_else(|_| c.clone()))
        .ok_or_else(|| format!("no column {name}"))
}

/// The time, error and duration columns of request rows, read row by row: a row that lacks a
/// value goes to the dead letters, naming the column.
pub(crate) struct RequestValues<'a> {
    /// The operator's id, for the dead letter's reason.
    pub(crate) operator: &'a str,
    /// The time, error and duration columns' names.
    pub(crate) names: [&'a str; 3],
    /// The error column, as [`integers_of`] gives it.
    pub(crate) errors: ArrayRef,
    /// The duration column, as [`integers_of`] gives it.
    pub(crate) durations: ArrayRef,
}

impl<'a> RequestValues<'a> {
    /// The columns named `names` (time, error, duration) of `rows`, for operator `operator`.
    pub(crate) fn of(
        rows: &RecordBatch,
        operator: &'a str,
        names: [&'a str; 3],
    ) -> Result<Self, String> {
        Ok(Self {
            operator,
            names,
            errors: integers_of(rows, names[1])?,
            durations: integers_of(rows, names[2])?,
        })
    }

    /// Row `row`'s (time, error, duration), or `None` once it went to the dead letters.
    pub(crate) fn at(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
        (row, time): (usize, Option<i64>),
    ) -> Option<(i64, i64, i64)> {
        let errors = integer_at(self.errors.as_ref(), row);
        let missing = match (time, errors, integer_at(self.durations.as_ref(), row)) {
            (Some(t), Some(e), Some(d)) => return Some((t, e, d)),
            (None, ..) => self.names[0],
            (_, None, _) => self.names[1],
            _ => self.names[2],
        };
        let reason = format!("operator {}: no {missing} value", self.operator);
        ctx.dead_letter(p, reason, rows, row);
        None
    }
}

/// The rows of `rows` at `take` for [`Minutes`]: the time column, then `columns` (one value
/// per taken row), the input row index and the exchange's source clock if the rows have one.
pub(crate) fn inner_rows(
    rows: &RecordBatch,
    time_column: &str,
    take: Vec<u32>,
    columns: Vec<(Field, ArrayRef)>,
) -> Result<RecordBatch, String> {
    let indices = Int64Array::from(take.iter().map(|r| i64::from(*r)).collect::<Vec<_>>());
    let take = UInt32Array::from(take);
    let pick = |c: &ArrayRef| arrow_select::take::take(c.as_ref(), &take, None);
    let time = rows
        .column_by_name(time_column)
        .ok_or_else(|| format!("no column {time_column}"))?;
    let time = pick(time).map_err(|e| e.to_string())?;
    // The time column keeps its own type (and time zone).
    let mut fields = vec![Field::new(time_column, time.data_type().clone(), false)];
    let mut arrays = vec![time];
    for (field, array) in columns {
        fields.push(field);
        arrays.push(array);
    }
    fields.push(Field::new(ROW_COLUMN, DataType::Int64, false));
    arrays.push(Arc::new(indices));
    if let Some(clocks) = rows.column_by_name(SOURCE_CLOCK_COLUMN) {
        fields.push(Field::new(SOURCE_CLOCK_COLUMN, DataType::Int64, true));
        arrays.push(pick(clocks).map_err(|e| e.to_string())?);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).map_err(|e| e.to_string())
}

/// The late table's rows of operator `id` (allowed lateness `lateness` µs): the rows of
/// `input` (its first `width` columns) that `late` names, each once, with why; `None` if
/// there are none.
fn late_input_rows(
    id: &str,
    lateness: i64,
    input: &RecordBatch,
    width: usize,
    mut late: Vec<(usize, i64)>,
) -> Result<Option<RecordBatch>, String> {
    late.sort();
    late.dedup_by_key(|(r, _)| *r);
    if late.is_empty() {
        return Ok(None);
    }
    late_rows(input, width, &late, |w| {
        format!(
            "operator {id}: its minute was evaluated already (watermark {w} µs, allowed \
             lateness {lateness} µs)"
        )
    })
    .map(Some)
}

/// What one call closed.
#[derive(Debug, Default)]
pub(crate) struct Closed {
    /// The closed minutes, as the window emits them (`window_start`, `window_end`, the key
    /// columns, the aggregates); each (minute, key) once.
    pub rows: Vec<RecordBatch>,
    /// (input row, the operator's watermark) of rows whose minute was evaluated already.
    pub late: Vec<(usize, i64)>,
}

/// Counts per minute and key, each minute emitted once, final.
pub(crate) struct Minutes {
    window: Window,
    lateness: i64,
    /// The operator's id, for the late rows' reason.
    id: String,
    /// Input rows sent to the operator's late output since the start.
    late_rows: u64,
}

impl Minutes {
    /// Counts rows of schema `inner` (as [`inner_rows`] builds them; its first field is the
    /// time column) of the exchanged stream `input`, per minute and `key`, with `aggregates`.
    pub(crate) fn new(
        id: &str,
        inner: &Schema,
        input: &StreamSpec,
        (out_of_orderness, allowed_lateness): (i64, i64),
        key: Vec<String>,
        aggregates: Vec<Aggregate>,
    ) -> Result<Self, String> {
        let time_column = inner.field(0).name().clone();
        let stream = StreamSpec {
            name: format!("{id}__minutes"),
            table: format!("{id}__minutes"),
            schema: Some(iceberg_schema(inner, &[])?),
            changelog: false,
            key: Vec::new(),
            time_column: Some(time_column.clone()),
            partition: Vec::new(),
            bloom_filter_columns: Vec::new(),
            plain_columns: Vec::new(),
            properties: floe_core::exchange::exchanged_property(input),
        };
        let window = Window::new(
            WindowSpec {
                id: id.to_string(),
                kind: WindowKind::Tumbling { size: MINUTE },
                time_column,
                out_of_orderness: out_of_orderness.saturating_add(allowed_lateness),
                allowed_lateness: 0,
                idle_after: None,
                key,
                aggregates,
                output: format!("{id}__counts"),
                late_output: format!("{id}__late"),
                final_output: None,
            },
            &stream,
        )?;
        Ok(Self {
            window,
            lateness: allowed_lateness,
            id: id.to_string(),
            late_rows: 0,
        })
    }

    /// Sends the input rows `late` names to the operator's late output (output 1) of
    /// partition `p`, each once, with why: `rows` are the input's, its first `width` columns
    /// the input stream's.
    pub(crate) fn emit_late(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        (rows, width): (&RecordBatch, usize),
        late: Vec<(usize, i64)>,
    ) -> Result<(), String> {
        if let Some(batch) = late_input_rows(&self.id, self.lateness, rows, width, late)? {
            self.late_rows += batch.num_rows() as u64;
            ctx.emit(1, StreamBatch::single(1, batch, p));
        }
        Ok(())
    }

    /// Calls the window with a context of its own; what it closed.
    fn run(
        &mut self,
        ctx: &mut Context<'_>,
        call: impl FnOnce(&mut Window, &mut Context<'_>) -> OpResult<()>,
    ) -> OpResult<Closed> {
        let mut inner = ctx.nested();
        call(&mut self.window, &mut inner)?;
        let (emitted, dead) = inner.finish();
        ctx.dead.extend(dead);
        let mut closed = Closed::default();
        for (output, batch) in emitted {
            let b = batch.batch;
            if output == 0 {
                closed.rows.push(b);
                continue;
            }
            let rows = b.column_by_name(ROW_COLUMN).expect("late rows");
            let marks = b.column_by_name("late_watermark").expect("late rows");
            for r in 0..b.num_rows() {
                closed.late.push((
                    integer_at(rows.as_ref(), r).unwrap_or_default() as usize,
                    integer_at(marks.as_ref(), r)
                        .unwrap_or_default()
                        .saturating_add(self.lateness),
                ));
            }
        }
        Ok(closed)
    }

    /// Counts `rows` (of [`inner_rows`]) of partition `p`.
    pub(crate) fn on_rows(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: Option<RecordBatch>,
    ) -> OpResult<Closed> {
        self.run(ctx, |window, inner| match rows {
            Some(b) => window.on_batch(&StreamBatch::single(0, b, p), inner),
            None => Ok(()),
        })
    }

    /// The operator's watermark of `p` moved.
    pub(crate) fn on_watermark(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        watermark: i64,
    ) -> OpResult<Closed> {
        let shifted = watermark.saturating_sub(self.lateness);
        self.run(ctx, |window, inner| window.on_watermark(p, shifted, inner))
    }

    /// A source clock behind the exchange moved.
    pub(crate) fn on_event_clock(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        max_time: i64,
    ) -> OpResult<Closed> {
        self.run(ctx, |window, inner| {
            window.on_event_clock(p, max_time, inner)
        })
    }

    /// Restores partition `p`'s counting state.
    pub(crate) fn on_restore(&mut self, ctx: &mut Context<'_>, p: u32) -> OpResult<()> {
        let mut inner = ctx.nested();
        self.window.on_restore(p, &mut inner)
    }

    /// Forgets what it holds in memory.
    pub(crate) fn forget(&mut self) {
        self.window.forget();
    }

    /// The minute (µs since the epoch / 60 s) the clock of `p` is in: every earlier minute
    /// is final.
    pub(crate) fn open_minute(&self, p: u32) -> Option<i64> {
        self.window
            .watermarks()
            .into_iter()
            .find_map(|(q, wm)| (q == p).then(|| wm.div_euclid(MINUTE)))
    }

    /// Per partition, the start of the minute the clock is in: every earlier minute is final
    /// and was evaluated.
    pub(crate) fn frontiers(&self) -> Vec<(u32, i64)> {
        self.window
            .watermarks()
            .into_iter()
            .map(|(p, wm)| (p, wm.div_euclid(MINUTE) * MINUTE))
            .collect()
    }

    /// The operator's watermarks (the window's run `allowed_lateness` behind).
    pub(crate) fn watermarks(&self) -> Vec<(u32, i64)> {
        self.window
            .watermarks()
            .into_iter()
            .map(|(p, wm)| (p, wm.saturating_add(self.lateness)))
            .collect()
    }

    /// The operator's statistics: the window's, with the operator's own late rows.
    pub(crate) fn stats(&self) -> OperatorStats {
        OperatorStats {
            late_rows: self.late_rows,
            ..self.window.stats()
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int32Array, Int64Array};

    use super::*;

    #[test]
    fn a_request_row_lacking_a_value_is_dead_lettered_naming_its_column() {
        let errors: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(0), Some(0)]));
        let durations: ArrayRef = Arc::new(Int64Array::from(vec![Some(5), Some(6), None, Some(7)]));
        let rows = RecordBatch::try_from_iter([
            ("error", errors.clone()),
            ("duration_ns", durations.clone()),
        ])
        .unwrap();
        let values = RequestValues::of(&rows, "op", ["ts", "error", "duration_ns"]).unwrap();
        let names = |p: u32| format!("x/{p}");
        let mut ctx = Context::new(None, 0, &names);
        let got: Vec<_> = [Some(10), Some(11), Some(12), None]
            .into_iter()
            .enumerate()
            .map(|(row, time)| values.at(&mut ctx, 3, &rows, (row, time)))
            .collect();
        assert_eq!(got, vec![Some((10, 1, 5)), None, None, None]);
        let (_, dead) = ctx.finish();
        let reasons: Vec<_> = dead
            .iter()
            .map(|d| (d.partition, d.reason.as_str()))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (3, "operator op: no error value"),
                (3, "operator op: no duration_ns value"),
                (3, "operator op: no ts value"),
            ]
        );
    }
}
