//! Window aggregates: parsed from the job file (`count()`, `sum(col)`, `quantile(col, 0.99)`,
//! …), accumulated per (window, key), kept in state, and written as **mergeable partial
//! columns**, so that partial rows of one window from several source partitions merge exactly
//! with a plain `GROUP BY`:
//!
//! | aggregate | columns | merge |
//! |---|---|---|
//! | `count()`, `count(c)` | `n` long | `sum(n)` |
//! | `sum(c)` | `n` long (integers) or double | `sum(n)` |
//! | `min(c)`, `max(c)` | `n` (long, double or timestamp) | `min(n)`, `max(n)` |
//! | `avg(c)` | `n` double, `n_sum`, `n_count` | `sum(n_sum) / sum(n_count)` |
//! | `count_distinct(c)` | `n` long (estimate), `n_hll` HyperLogLog registers | max rank per register (`floe_sketch`) |
//! | `quantile(c, q)` | `n` double (estimate), `n_sketch` DDSketch buckets | sum of counts per bucket |
//! | `max_by(c, by)` | `n` string (`c` of the row with the largest `by`), `n_by` double | `n` of the partial with the largest `n_by` |
//!
//! Sums of integer columns are exact (the merged answer equals the one-pass answer); sums of
//! doubles are exact up to the order of floating-point additions. Null values are skipped
//! (`count()` counts rows, `count(c)` non-null values).
//!
//! `quantile(c, q)` over a column of stored sketches (another window's `<name>_sketch`,
//! detected by its type) merges them instead of adding values: rolling a rollup up again —
//! per service from per-endpoint rows, per hour from per-minute rows — gives the same answer
//! as one pass over the original values.
//!
//! `max_by` (Trino's and DuckDB's name) picks one row's string `c`, such as the trace id of
//! the slowest request: rows whose `by` is null or NaN are skipped, and of rows with the same
//! `by` the largest `c` wins, so the pick never depends on arrival order.

use floe_core::rollup::MergeRule;
use std::sync::Arc;

use arrow_array::builder::{Float64Builder, Int64Builder, TimestampMicrosecondBuilder};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use floe_sketch::{HyperLogLog, QuantileSketch, hll, quantile};

use crate::codec::{Reader, Writer, float_at, integer_at};

/// What an aggregate computes.
#[derive(Debug, Clone, PartialEq)]
pub enum AggKind {
    /// Rows.
    Count,
    /// Non-null values of a column.
    CountColumn(String),
    /// Sum.
    Sum(String),
    /// Minimum.
    Min(String),
    /// Maximum.
    Max(String),
    /// Mean.
    Avg(String),
    /// Distinct values (HyperLogLog, standard error 0.81 %).
    CountDistinct(String),
    /// The `q` quantile (DDSketch, relative error 1 %).
    Quantile(String, f64),
    /// The string column's value in the row where the second column is largest.
    MaxBy(String, String),
}

/// A named aggregate of a window operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    /// Its output column.
    pub name: String,
    /// What it computes.
    pub kind: AggKind,
}

impl AggKind {
    /// The input column, if any.
    pub fn column(&self) -> Option<&str> {
        match self {
            Self::Count => None,
            Self::CountColumn(c)
            | Self::Sum(c)
            | Self::Min(c)
            | Self::Max(c)
            | Self::Avg(c)
            | Self::CountDistinct(c)
            | Self::Quantile(c, _)
            | Self::MaxBy(c, _) => Some(c),
        }
    }

    /// The column a row is picked by, if any.
    pub fn by_column(&self) -> Option<&str> {
        match self {
            Self::MaxBy(_, by) => Some(by),
            _ => None,
        }
    }
}

/// Parses `count()`, `count(c)`, `sum(c)`, `min(c)`, `max(c)`, `avg(c)`,
/// `count_distinct(c)`, `quantile(c, q)` and `max_by(c, by)`.
pub fn parse_aggregate(name: &str, text: &str) -> Result<Aggregate, String> {
    let bad = || {
        format!(
            "{text:?} is not an aggregate: count(), count(col), sum(col), min(col), max(col), \
             avg(col), count_distinct(col), quantile(col, 0.99) or max_by(col, by)"
        )
    };
    let (function, rest) = text.trim().split_once('(').ok_or_else(bad)?;
    let args: Vec<&str> = rest
        .strip_suffix(')')
        .ok_or_else(bad)?
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    let column = |args: &[&str]| match args {
        [c] if c.chars().all(|ch| ch.is_alphanumeric() || ch == '_') => Ok(c.to_string()),
        _ => Err(bad()),
    };
    let kind = match (function.trim(), args.as_slice()) {
        ("count", []) | ("count", ["*"]) => AggKind::Count,
        ("count", a) => AggKind::CountColumn(column(a)?),
        ("sum", a) => AggKind::Sum(column(a)?),
        ("min", a) => AggKind::Min(column(a)?),
        ("max", a) => AggKind::Max(column(a)?),
        ("avg", a) => AggKind::Avg(column(a)?),
        ("count_distinct", a) => AggKind::CountDistinct(column(a)?),
        ("quantile", [c, q]) => {
            let q: f64 = q.parse().map_err(|_| bad())?;
            if !(0.0..=1.0).contains(&q) {
                return Err(format!("quantile {q} is not between 0 and 1"));
            }
            AggKind::Quantile(column(&[c])?, q)
        }
        ("max_by", [c, by]) => AggKind::MaxBy(column(&[c])?, column(&[by])?),
        _ => return Err(bad()),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
    {
        return Err(format!(
            "{name:?}: an aggregate's name is letters, digits and '_'"
        ));
    }
    Ok(Aggregate {
        name: name.to_string(),
        kind,
    })
}

/// How an input column's values are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Numbers {
    /// Integers (and dates, as days).
    Integer,
    /// Timestamps, as µs.
    Micros(i64),
    /// Floating point.
    Float,
}

fn numbers(ty: &DataType) -> Option<Numbers> {
    Some(match ty {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => Numbers::Integer,
        DataType::Float32 | DataType::Float64 => Numbers::Float,
        DataType::Timestamp(unit, _) => Numbers::Micros(match unit {
            TimeUnit::Second => -1_000_000,
            TimeUnit::Millisecond => -1_000,
            TimeUnit::Microsecond => 1,
            TimeUnit::Nanosecond => 1_000,
        }),
        _ => return None,
    })
}

/// An aggregate bound to its input column.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The aggregate.
    pub aggregate: Aggregate,
    column: Option<usize>,
    /// `max_by`'s `by` column.
    by: Option<usize>,
    numbers: Numbers,
    timezone: Option<Arc<str>>,
    /// `quantile` over a column of stored sketches: they are merged.
    sketches: bool,
}

impl Bound {
    /// Binds `aggregate` to its column in `schema`; `Err` says why it cannot be computed.
    pub fn new(aggregate: &Aggregate, schema: &Schema) -> Result<Self, String> {
        let (column, numbers, timezone) = match aggregate.kind.column() {
            None => (None, Numbers::Integer, None),
            Some(name) => {
                let (index, field) = schema
                    .column_with_name(name)
                    .ok_or_else(|| format!("{}: the input has no column {name}", aggregate.name))?;
                let needs_numbers = !matches!(
                    aggregate.kind,
                    AggKind::CountColumn(_) | AggKind::CountDistinct(_) | AggKind::MaxBy(..)
                );
                if matches!(aggregate.kind, AggKind::MaxBy(..))
                    && !matches!(
                        field.data_type(),
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                    )
                {
                    return Err(format!(
                        "{}: max_by picks a string column; {name} is {}",
                        aggregate.name,
                        field.data_type()
                    ));
                }
                let n = numbers(field.data_type());
                let merges = matches!(aggregate.kind, AggKind::Quantile(..))
                    && quantile::is_sketch_type(field.data_type());
                if needs_numbers && n.is_none() && !merges {
                    return Err(format!(
                        "{}: column {name} is {}, not a number or timestamp",
                        aggregate.name,
                        field.data_type()
                    ));
                }
                if matches!(aggregate.kind, AggKind::CountDistinct(_))
                    && !hll_accepts(field.data_type())
                {
                    return Err(format!(
                        "{}: count_distinct cannot hash {} values",
                        aggregate.name,
                        field.data_type()
                    ));
                }
                let tz = match field.data_type() {
                    DataType::Timestamp(_, tz) => tz.clone(),
                    _ => None,
                };
                (Some(index), n.unwrap_or(Numbers::Integer), tz)
            }
        };
        let by = match aggregate.kind.by_column() {
            None => None,
            Some(name) => {
                let (index, field) = schema
                    .column_with_name(name)
                    .ok_or_else(|| format!("{}: the input has no column {name}", aggregate.name))?;
                if self::numbers(field.data_type()).is_none() {
                    return Err(format!(
                        "{}: column {name} is {}, not a number or timestamp",
                        aggregate.name,
                        field.data_type()
                    ));
                }
                Some(index)
            }
        };
        let sketches = matches!(aggregate.kind, AggKind::Quantile(..))
            && column.is_some_and(|i| quantile::is_sketch_type(schema.field(i).data_type()));
        Ok(Self {
            aggregate: aggregate.clone(),
            column,
            by,
            numbers,
            timezone,
            sketches,
        })
    }

    /// A fresh accumulator.
    pub fn empty(&self) -> Acc {
        let float = self.numbers == Numbers::Float;
        match &self.aggregate.kind {
            AggKind::Count | AggKind::CountColumn(_) => Acc::Count(0),
            AggKind::Sum(_) if float => Acc::SumF(0.0),
            AggKind::Sum(_) => Acc::SumI(0),
            AggKind::Min(_) if float => Acc::MinF(None),
            AggKind::Min(_) => Acc::MinI(None),
            AggKind::Max(_) if float => Acc::MaxF(None),
            AggKind::Max(_) => Acc::MaxI(None),
            AggKind::Avg(_) if float => Acc::AvgF(0.0, 0),
            AggKind::Avg(_) => Acc::AvgI(0, 0),
            AggKind::CountDistinct(_) => Acc::Hll(Box::default()),
            AggKind::Quantile(..) => Acc::Quantile(Box::default()),
            AggKind::MaxBy(..) => Acc::MaxBy(None),
        }
    }

    fn integer(&self, array: &dyn Array, row: usize) -> Option<i64> {
        let v = integer_at(array, row)?;
        Some(match self.numbers {
            Numbers::Micros(scale) if scale < 0 => v.saturating_mul(-scale),
            Numbers::Micros(scale) => v / scale,
            _ => v,
        })
    }

    /// Adds row `row` of `columns` (the input batch's) to `acc`.
    pub fn add(&self, acc: &mut Acc, columns: &[ArrayRef], row: usize) {
        let Some(index) = self.column else {
            if let Acc::Count(n) = acc {
                *n += 1;
            }
            return;
        };
        let array = columns[index].as_ref();
        if array.is_null(row) {
            return;
        }
        if let Acc::MaxBy(best) = acc {
            let by = self.by.and_then(|b| float_at(columns[b].as_ref(), row));
            if let (Some(by), Some(value)) = (by.filter(|b| !b.is_nan()), string_at(array, row)) {
                pick_max_by(best, by, value);
            }
            return;
        }
        match acc {
            Acc::Count(n) => *n += 1,
            Acc::SumI(s) => *s = s.wrapping_add(self.integer(array, row).unwrap_or(0)),
            Acc::SumF(s) => *s += float_at(array, row).unwrap_or(0.0),
            Acc::MinI(m) => {
                let v = self.integer(array, row);
                *m = min_opt(*m, v);
            }
            Acc::MaxI(m) => {
                let v = self.integer(array, row);
                *m = max_opt(*m, v);
            }
            Acc::MinF(m) => *m = fmin_opt(*m, float_at(array, row)),
            Acc::MaxF(m) => *m = fmax_opt(*m, float_at(array, row)),
            Acc::AvgI(s, n) => {
                *s = s.wrapping_add(self.integer(array, row).unwrap_or(0));
                *n += 1;
            }
            Acc::AvgF(s, n) => {
                *s += float_at(array, row).unwrap_or(0.0);
                *n += 1;
            }
            Acc::Hll(h) => {
                let _ = h.add_array(&array.slice(row, 1));
            }
            Acc::Quantile(q) if self.sketches => {
                let stored = array
                    .as_any()
                    .downcast_ref::<arrow_array::ListArray>()
                    .and_then(|list| quantile::from_list_array(list, row).ok().flatten());
                // A sketch that does not read back is skipped like a null.
                if let Some(stored) = stored {
                    q.merge(&stored);
                }
            }
            Acc::Quantile(q) => {
                if let Some(v) = float_at(array, row) {
                    // NaN and infinities cannot be placed in a bucket: skipped like nulls.
                    let _ = q.add(v);
                }
            }
            Acc::MaxBy(_) => {}
        }
    }

    /// The output fields of this aggregate (the value, then its mergeable parts).
    pub fn fields(&self) -> Vec<Field> {
        let name = &self.aggregate.name;
        let value = match (&self.aggregate.kind, self.numbers) {
            (AggKind::Count | AggKind::CountColumn(_) | AggKind::CountDistinct(_), _) => {
                DataType::Int64
            }
            (AggKind::Avg(_) | AggKind::Quantile(..), _) => DataType::Float64,
            (AggKind::MaxBy(..), _) => DataType::Utf8,
            (_, Numbers::Float) => DataType::Float64,
            (AggKind::Min(_) | AggKind::Max(_), Numbers::Micros(_)) => {
                DataType::Timestamp(TimeUnit::Microsecond, self.timezone.clone())
            }
            _ => DataType::Int64,
        };
        let mut fields = vec![Field::new(name, value, false)];
        match &self.aggregate.kind {
            AggKind::Min(_) | AggKind::Max(_) => {
                fields[0] = fields[0].clone().with_nullable(true);
            }
            AggKind::Quantile(..) => {
                fields[0] = fields[0].clone().with_nullable(true);
                fields.push(Field::new(
                    format!("{name}_sketch"),
                    quantile::data_type(),
                    false,
                ));
            }
            AggKind::CountDistinct(_) => {
                fields.push(Field::new(format!("{name}_hll"), hll::data_type(), false));
            }
            AggKind::MaxBy(..) => {
                fields[0] = fields[0].clone().with_nullable(true);
                fields.push(Field::new(format!("{name}_by"), DataType::Float64, true));
            }
            AggKind::Avg(_) => {
                fields[0] = fields[0].clone().with_nullable(true);
                let sum = if self.numbers == Numbers::Float {
                    DataType::Float64
                } else {
                    DataType::Int64
                };
                fields.push(Field::new(format!("{name}_sum"), sum, false));
                fields.push(Field::new(format!("{name}_count"), DataType::Int64, false));
            }
            _ => {}
        }
        fields
    }

    /// How the maintenance merge combines each of [`fields`](Self::fields).
    pub fn merges(&self) -> Vec<(String, MergeRule)> {
        let name = &self.aggregate.name;
        let part = |suffix: &str| format!("{name}_{suffix}");
        match &self.aggregate.kind {
            AggKind::Count | AggKind::CountColumn(_) | AggKind::Sum(_) => {
                vec![(name.clone(), MergeRule::Sum)]
            }
            AggKind::Min(_) => vec![(name.clone(), MergeRule::Min)],
            AggKind::Max(_) => vec![(name.clone(), MergeRule::Max)],
            AggKind::Avg(_) => vec![
                (
                    name.clone(),
                    MergeRule::Avg {
                        sum: part("sum"),
                        count: part("count"),
                    },
                ),
                (part("sum"), MergeRule::Sum),
                (part("count"), MergeRule::Sum),
            ],
            AggKind::CountDistinct(_) => vec![
                (name.clone(), MergeRule::Distinct { hll: part("hll") }),
                (part("hll"), MergeRule::Hll),
            ],
            AggKind::Quantile(_, q) => vec![
                (
                    name.clone(),
                    MergeRule::Quantile {
                        sketch: part("sketch"),
                        q: *q,
                    },
                ),
                (part("sketch"), MergeRule::Sketch),
            ],
            AggKind::MaxBy(..) => vec![
                (name.clone(), MergeRule::MaxBy { by: part("by") }),
                (part("by"), MergeRule::Max),
            ],
        }
    }
}

/// The string at `row` of a string column.
fn string_at(array: &dyn Array, row: usize) -> Option<&str> {
    use arrow_array::cast::AsArray;
    if array.is_null(row) {
        return None;
    }
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => Some(array.as_string::<i64>().value(row)),
        DataType::Utf8View => Some(array.as_string_view().value(row)),
        _ => None,
    }
}

/// Keeps the larger of `best` and (`by`, `value`): by `by`, then by `value`.
fn pick_max_by(best: &mut Option<(f64, String)>, by: f64, value: &str) {
    let better = match best {
        None => true,
        Some((b, v)) => floe_core::rollup::pick_order((by, value), (*b, v)).is_gt(),
    };
    if better {
        *best = Some((by, value.to_string()));
    }
}

fn hll_accepts(ty: &DataType) -> bool {
    HyperLogLog::new()
        .add_array(arrow_array::new_empty_array(ty).as_ref())
        .is_ok()
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
fn max_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}
fn fmin_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
fn fmax_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// An aggregate's running state.
#[derive(Debug, Clone, PartialEq)]
pub enum Acc {
    /// A count.
    Count(u64),
    /// An integer sum.
    SumI(i64),
    /// A float sum.
    SumF(f64),
    /// An integer minimum.
    MinI(Option<i64>),
    /// A float minimum.
    MinF(Option<f64>),
    /// An integer maximum.
    MaxI(Option<i64>),
    /// A float maximum.
    MaxF(Option<f64>),
    /// An integer sum and count.
    AvgI(i64, u64),
    /// A float sum and count.
    AvgF(f64, u64),
    /// Distinct values.
    Hll(Box<HyperLogLog>),
    /// A quantile sketch.
    Quantile(Box<QuantileSketch>),
    /// The largest (by, value) so far.
    MaxBy(Option<(f64, String)>),
}

impl Acc {
    /// Adds `other` (of the same aggregate) into this one.
    pub fn merge(&mut self, other: &Acc) {
        match (self, other) {
            (Acc::Count(a), Acc::Count(b)) => *a += b,
            (Acc::SumI(a), Acc::SumI(b)) => *a = a.wrapping_add(*b),
            (Acc::SumF(a), Acc::SumF(b)) => *a += b,
            (Acc::MinI(a), Acc::MinI(b)) => *a = min_opt(*a, *b),
            (Acc::MaxI(a), Acc::MaxI(b)) => *a = max_opt(*a, *b),
            (Acc::MinF(a), Acc::MinF(b)) => *a = fmin_opt(*a, *b),
            (Acc::MaxF(a), Acc::MaxF(b)) => *a = fmax_opt(*a, *b),
            (Acc::AvgI(s, n), Acc::AvgI(t, m)) => {
                *s = s.wrapping_add(*t);
                *n += m;
            }
            (Acc::AvgF(s, n), Acc::AvgF(t, m)) => {
                *s += t;
                *n += m;
            }
            (Acc::Hll(a), Acc::Hll(b)) => a.merge(b),
            (Acc::Quantile(a), Acc::Quantile(b)) => a.merge(b),
            (Acc::MaxBy(a), Acc::MaxBy(Some((by, value)))) => pick_max_by(a, *by, value),
            _ => {}
        }
    }

    /// Appends the stored form.
    pub fn encode(&self, w: &mut Writer) {
        let opt_i = |w: &mut Writer, v: Option<i64>| {
            w.u8(v.is_some() as u8);
            w.i64(v.unwrap_or(0));
        };
        let opt_f = |w: &mut Writer, v: Option<f64>| {
            w.u8(v.is_some() as u8);
            w.f64(v.unwrap_or(0.0));
        };
        match self {
            Acc::Count(n) => w.u64(*n),
            Acc::SumI(s) => w.i64(*s),
            Acc::SumF(s) => w.f64(*s),
            Acc::MinI(m) | Acc::MaxI(m) => opt_i(w, *m),
            Acc::MinF(m) | Acc::MaxF(m) => opt_f(w, *m),
            Acc::AvgI(s, n) => {
                w.i64(*s);
                w.u64(*n);
            }
            Acc::AvgF(s, n) => {
                w.f64(*s);
                w.u64(*n);
            }
            Acc::Hll(h) => {
                w.u64(h.num_nonzero() as u64);
                for (i, r) in h.registers() {
                    w.u64(((i as u64) << 8) | r as u64);
                }
            }
            Acc::Quantile(q) => {
                let buckets: Vec<(i32, u64)> = q.buckets().collect();
                w.u64(buckets.len() as u64);
                for (k, n) in buckets {
                    w.i64(k as i64);
                    w.u64(n);
                }
            }
            Acc::MaxBy(best) => {
                let (by, value) = best.as_ref().map_or((None, ""), |(b, v)| (Some(*b), v));
                opt_f(w, by);
                w.short_bytes(value.as_bytes());
            }
        }
    }

    /// Reads the stored form of an accumulator shaped like `empty`.
    pub fn decode(empty: &Acc, r: &mut Reader<'_>) -> Result<Acc, String> {
        let opt_i = |r: &mut Reader<'_>| -> Result<Option<i64>, String> {
            let some = r.u8()? != 0;
            let v = r.i64()?;
            Ok(some.then_some(v))
        };
        let opt_f = |r: &mut Reader<'_>| -> Result<Option<f64>, String> {
            let some = r.u8()? != 0;
            let v = r.f64()?;
            Ok(some.then_some(v))
        };
        Ok(match empty {
            Acc::Count(_) => Acc::Count(r.u64()?),
            Acc::SumI(_) => Acc::SumI(r.i64()?),
            Acc::SumF(_) => Acc::SumF(r.f64()?),
            Acc::MinI(_) => Acc::MinI(opt_i(r)?),
            Acc::MaxI(_) => Acc::MaxI(opt_i(r)?),
            Acc::MinF(_) => Acc::MinF(opt_f(r)?),
            Acc::MaxF(_) => Acc::MaxF(opt_f(r)?),
            Acc::AvgI(..) => Acc::AvgI(r.i64()?, r.u64()?),
            Acc::AvgF(..) => Acc::AvgF(r.f64()?, r.u64()?),
            Acc::Hll(_) => {
                let n = r.u64()? as usize;
                let mut registers = Vec::with_capacity(n);
                for _ in 0..n {
                    let packed = r.u64()?;
                    registers.push(((packed >> 8) as i32, (packed & 0xff) as i32));
                }
                Acc::Hll(Box::new(
                    HyperLogLog::from_registers(registers).map_err(|e| format!("{e:?}"))?,
                ))
            }
            Acc::Quantile(_) => {
                let n = r.u64()? as usize;
                let mut buckets = Vec::with_capacity(n);
                for _ in 0..n {
                    buckets.push((r.i64()? as i32, r.u64()? as i64));
                }
                Acc::Quantile(Box::new(
                    QuantileSketch::from_buckets(buckets).map_err(|e| format!("{e:?}"))?,
                ))
            }
            Acc::MaxBy(_) => {
                let by = opt_f(r)?;
                let value =
                    String::from_utf8(r.short_bytes()?.to_vec()).map_err(|e| e.to_string())?;
                Acc::MaxBy(by.map(|b| (b, value)))
            }
        })
    }
}

/// Builds the output columns of one aggregate over many rows.
#[derive(Debug)]
pub struct Columns {
    bound: Bound,
    value_i: Int64Builder,
    value_f: Float64Builder,
    value_t: TimestampMicrosecondBuilder,
    sum_i: Int64Builder,
    sum_f: Float64Builder,
    count: Int64Builder,
    sketches_h: Vec<HyperLogLog>,
    sketches_q: Vec<QuantileSketch>,
    value_s: arrow_array::builder::StringBuilder,
}

impl Columns {
    /// Empty columns for `bound`.
    pub fn new(bound: &Bound) -> Self {
        Self {
            bound: bound.clone(),
            value_i: Int64Builder::new(),
            value_f: Float64Builder::new(),
            value_t: TimestampMicrosecondBuilder::new(),
            sum_i: Int64Builder::new(),
            sum_f: Float64Builder::new(),
            count: Int64Builder::new(),
            sketches_h: Vec::new(),
            sketches_q: Vec::new(),
            value_s: arrow_array::builder::StringBuilder::new(),
        }
    }

    /// Appends one row's value.
    pub fn push(&mut self, acc: &Acc) {
        let timestamp = matches!(
            (&self.bound.aggregate.kind, self.bound.numbers),
            (AggKind::Min(_) | AggKind::Max(_), Numbers::Micros(_))
        );
        match acc {
            Acc::Count(n) => self.value_i.append_value(*n as i64),
            Acc::SumI(s) => self.value_i.append_value(*s),
            Acc::SumF(s) => self.value_f.append_value(*s),
            Acc::MinI(m) | Acc::MaxI(m) if timestamp => self.value_t.append_option(*m),
            Acc::MinI(m) | Acc::MaxI(m) => self.value_i.append_option(*m),
            Acc::MinF(m) | Acc::MaxF(m) => self.value_f.append_option(*m),
            Acc::AvgI(s, n) => {
                self.value_f
                    .append_option((*n > 0).then(|| *s as f64 / *n as f64));
                self.sum_i.append_value(*s);
                self.count.append_value(*n as i64);
            }
            Acc::AvgF(s, n) => {
                self.value_f.append_option((*n > 0).then(|| *s / *n as f64));
                self.sum_f.append_value(*s);
                self.count.append_value(*n as i64);
            }
            Acc::Hll(h) => {
                self.value_i.append_value(h.estimate() as i64);
                self.sketches_h.push((**h).clone());
            }
            Acc::Quantile(q) => {
                let AggKind::Quantile(_, at) = self.bound.aggregate.kind else {
                    return;
                };
                self.value_f.append_option(q.quantile(at));
                self.sketches_q.push((**q).clone());
            }
            Acc::MaxBy(best) => {
                self.value_s.append_option(best.as_ref().map(|(_, v)| v));
                self.value_f.append_option(best.as_ref().map(|(b, _)| *b));
            }
        }
    }

    /// The columns, in [`Bound::fields`] order.
    pub fn finish(&mut self) -> Vec<ArrayRef> {
        let fields = self.bound.fields();
        let first = fields[0].data_type().clone();
        let value: ArrayRef = match first {
            DataType::Float64 => Arc::new(self.value_f.finish()),
            DataType::Utf8 => Arc::new(self.value_s.finish()),
            DataType::Timestamp(..) => Arc::new(
                self.value_t
                    .finish()
                    .with_timezone_opt(self.bound.timezone.clone()),
            ),
            _ => Arc::new(self.value_i.finish()),
        };
        let mut out = vec![value];
        match &self.bound.aggregate.kind {
            AggKind::Avg(_) => {
                if self.bound.numbers == Numbers::Float {
                    out.push(Arc::new(self.sum_f.finish()));
                } else {
                    out.push(Arc::new(self.sum_i.finish()));
                }
                out.push(Arc::new(self.count.finish()));
            }
            AggKind::CountDistinct(_) => {
                let sketches = std::mem::take(&mut self.sketches_h);
                out.push(Arc::new(
                    hll::to_list_array(sketches.iter()).expect("valid registers"),
                ));
            }
            AggKind::Quantile(..) => {
                let sketches = std::mem::take(&mut self.sketches_q);
                out.push(Arc::new(
                    quantile::to_list_array(sketches.iter()).expect("valid buckets"),
                ));
            }
            AggKind::MaxBy(..) => out.push(Arc::new(self.value_f.finish())),
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Float64Array, Int64Array, StringArray};

    use super::*;

    #[test]
    fn aggregates_parse_or_say_what_is_allowed() {
        assert_eq!(
            parse_aggregate("n", "count()").unwrap().kind,
            AggKind::Count
        );
        assert_eq!(
            parse_aggregate("p", "quantile(d, 0.99)").unwrap().kind,
            AggKind::Quantile("d".into(), 0.99)
        );
        assert!(parse_aggregate("p", "quantile(d, 2)").is_err());
        assert!(
            parse_aggregate("x", "median(d)")
                .unwrap_err()
                .contains("count()")
        );
        assert!(parse_aggregate("bad name", "count()").is_err());
    }

    #[test]
    fn accumulators_merge_like_one_pass_and_survive_encoding() {
        let schema = Schema::new(vec![
            Field::new("d", DataType::Int64, true),
            Field::new("f", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![Some(5), None, Some(1), Some(9)])),
            Arc::new(Float64Array::from(vec![
                Some(0.5),
                Some(2.0),
                None,
                Some(1.5),
            ])),
            Arc::new(StringArray::from(vec!["a", "b", "a", "c"])),
        ];
        for text in [
            "count()",
            "count(d)",
            "sum(d)",
            "min(d)",
            "max(f)",
            "avg(d)",
            "avg(f)",
            "count_distinct(s)",
            "quantile(d, 0.5)",
            "max_by(s, f)",
        ] {
            let bound = Bound::new(&parse_aggregate("x", text).unwrap(), &schema).unwrap();
            let mut whole = bound.empty();
            let (mut left, mut right) = (bound.empty(), bound.empty());
            for row in 0..4 {
                bound.add(&mut whole, &columns, row);
                bound.add(if row < 2 { &mut left } else { &mut right }, &columns, row);
            }
            left.merge(&right);
            assert_eq!(left, whole, "{text}");
            let mut w = Writer::default();
            whole.encode(&mut w);
            let back = Acc::decode(&bound.empty(), &mut Reader(&w.0)).unwrap();
            assert_eq!(back, whole, "{text}");
            let mut out = Columns::new(&bound);
            out.push(&whole);
            let arrays = out.finish();
            assert_eq!(arrays.len(), bound.fields().len(), "{text}");
        }
        assert!(Bound::new(&parse_aggregate("x", "sum(s)").unwrap(), &schema).is_err());
        assert!(Bound::new(&parse_aggregate("x", "max_by(d, f)").unwrap(), &schema).is_err());
        assert!(Bound::new(&parse_aggregate("x", "max_by(s, s)").unwrap(), &schema).is_err());
    }

    #[test]
    fn a_quantile_of_stored_sketches_merges_them_like_one_pass() {
        // Two "endpoints" of one service: their rows' sketches, as a first window writes them.
        let durations: [&[f64]; 2] = [&[3.0, 8.0, 120.0, 9.5], &[1.0, 700.0, 42.0]];
        let mut one_pass = QuantileSketch::new();
        let parts: Vec<QuantileSketch> = durations
            .iter()
            .map(|values| {
                let mut s = QuantileSketch::new();
                for &v in *values {
                    s.add(v).unwrap();
                    one_pass.add(v).unwrap();
                }
                s
            })
            .collect();
        let stored = quantile::to_list_array(parts.iter().map(Some).chain([None])).unwrap();
        let schema = Schema::new(vec![Field::new(
            "p99_sketch",
            stored.data_type().clone(),
            true,
        )]);
        let columns: Vec<ArrayRef> = vec![Arc::new(stored)];
        let bound = Bound::new(
            &parse_aggregate("p99", "quantile(p99_sketch, 0.99)").unwrap(),
            &schema,
        )
        .unwrap();
        let mut acc = bound.empty();
        for row in 0..3 {
            bound.add(&mut acc, &columns, row); // the null sketch adds nothing
        }
        assert_eq!(acc, Acc::Quantile(Box::new(one_pass.clone())));
        let mut out = Columns::new(&bound);
        out.push(&acc);
        let arrays = out.finish();
        assert_eq!(float_at(arrays[0].as_ref(), 0), one_pass.quantile(0.99));
        // Any other list is not a sketch, and not a number.
        let other = Schema::new(vec![Field::new(
            "p99_sketch",
            floe_sketch::hll::data_type(),
            true,
        )]);
        assert!(
            Bound::new(
                &parse_aggregate("p99", "quantile(p99_sketch, 0.99)").unwrap(),
                &other
            )
            .is_err()
        );
    }

    #[test]
    fn max_by_picks_the_same_row_in_any_order() {
        let schema = Schema::new(vec![
            Field::new("trace", DataType::Utf8, true),
            Field::new("ns", DataType::Int64, true),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![
                Some("a"),
                Some("c"),
                Some("b"),
                None,
                Some("z"),
            ])),
            Arc::new(Int64Array::from(vec![
                Some(7),
                Some(9),
                Some(9),
                Some(50),
                None,
            ])),
        ];
        let bound = Bound::new(
            &parse_aggregate("slowest", "max_by(trace, ns)").unwrap(),
            &schema,
        )
        .unwrap();
        for order in [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]] {
            let mut acc = bound.empty();
            for row in order {
                bound.add(&mut acc, &columns, row);
            }
            // A null pick and a null `by` are skipped; of the ties at 9, "c" wins.
            assert_eq!(acc, Acc::MaxBy(Some((9.0, "c".into()))), "{order:?}");
        }
        let mut out = Columns::new(&bound);
        out.push(&Acc::MaxBy(Some((9.0, "c".into()))));
        out.push(&bound.empty());
        let arrays = out.finish();
        let names: Vec<String> = bound.fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(names, ["slowest", "slowest_by"]);
        assert_eq!(
            arrays[0].as_ref(),
            &StringArray::from(vec![Some("c"), None]) as &dyn Array
        );
        assert_eq!(
            arrays[1].as_ref(),
            &Float64Array::from(vec![Some(9.0), None]) as &dyn Array
        );
    }
}
