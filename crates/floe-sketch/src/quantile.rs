//! DDSketch-style quantile sketch, stored as a `list<struct<k, n>>` column.
//!
//! # Accuracy
//!
//! Relative accuracy `alpha = 0.01` ([`RELATIVE_ACCURACY`]), `gamma = (1 + alpha) / (1 - alpha)`
//! ([`GAMMA`]). For any value distribution and any `q`, the estimate of quantile `q` is within
//! `alpha` relative error of the element at 0-based position `floor(q * (N - 1))` of the
//! sorted inserted values (up to about 1e-12 of floating-point rounding at bucket
//! boundaries); values with `|x| < 1e-300` are counted as `0`, an absolute error below
//! 1e-300.
//!
//! # Buckets and keys
//!
//! A finite value `x` with `|x| <= 1e300` ([`MAX_MAGNITUDE`]) goes to one bucket, named by an
//! `i32` key `k` such that ordering by `k` is ordering by value:
//!
//! ```text
//! index(a)  = ceil(ln(a) / ln(gamma))            for a >= 1e-300, in f64
//! x >= 1e-300            ->  k = 1_048_576 + index(x)
//! |x| < 1e-300 (and 0)   ->  k = 0
//! x <= -1e-300           ->  k = -(1_048_576 + index(-x))
//! ```
//!
//! `index` ranges over `[MIN_INDEX, MAX_INDEX] = [-34537, 34538]`, so positive keys lie in
//! `[1_014_039, 1_083_114]`, negative keys mirror them, and both are far from `0` and from the
//! `i32` limits. NaN, ±infinity and `|x| > 1e300` are refused ([`SketchError::RefusedValue`]);
//! the caller decides what to do with them.
//!
//! The value of a key — the bucket's representative, within `alpha` of every value in it:
//!
//! ```text
//! v(i)     = 2 * gamma^i / (gamma + 1)         (gamma^i computed as pow(gamma, i))
//! value(0) = 0;   value(k > 0) = v(k - 1_048_576);   value(k < 0) = -v(-k - 1_048_576)
//! ```
//!
//! # Stored layout
//!
//! `List<element: Struct<k: Int32, n: Int64>>` (all fields non-nullable, the list nullable):
//! the non-empty buckets sorted by `k`, `n >= 1` their counts. See [`data_type`],
//! [`to_list_array`] and [`from_list_array`]. The total count `N` is the sum of the `n`.
//!
//! # Merge
//!
//! Per key the sum of the counts ([`QuantileSketch::merge`]); in SQL
//! `sum(n) GROUP BY group, k`. Merging is exact: the merge of the sketches of two multisets is
//! the sketch of their union.
//!
//! # Quantile
//!
//! For `q ∈ [0, 1]`: `N = Σ n`; `rank = q * (N - 1)` in `f64`; walk the keys in ascending
//! order accumulating `n`; the answer is the value of the first key whose cumulative count
//! (as `f64`) is `> rank`. `N = 0` gives no answer (SQL `NULL`). The SQL queries give the
//! same value as long as `N < 2^53`.
//!
//! Note that DuckDB's `quantile_disc` picks position `max(ceil(q N), 1) - 1` instead, which
//! can be one higher than `floor(q (N - 1))` (e.g. `q = 0.99`, `N = 1234`).

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrowPrimitiveType, ListArray};
use arrow_schema::DataType;

use crate::SketchError;
use crate::layout::{PairListBuilder, is_pair_list, pair_list_type, read_pairs};

/// Relative accuracy `alpha`.
pub const RELATIVE_ACCURACY: f64 = 0.01;
/// `gamma = (1 + alpha) / (1 - alpha)`, the ratio between consecutive bucket bounds.
pub const GAMMA: f64 = (1.0 + RELATIVE_ACCURACY) / (1.0 - RELATIVE_ACCURACY);
/// Offset added to the bucket index of non-zero values to form the key.
pub const KEY_OFFSET: i32 = 1_048_576;
/// Values with a smaller magnitude go to the zero bucket.
pub const MIN_MAGNITUDE: f64 = 1e-300;
/// Values with a larger magnitude are refused.
pub const MAX_MAGNITUDE: f64 = 1e300;
/// `index(MIN_MAGNITUDE)`, the smallest bucket index.
pub const MIN_INDEX: i32 = -34537;
/// `index(MAX_MAGNITUDE)`, the largest bucket index.
pub const MAX_INDEX: i32 = 34538;
/// Name of the bucket key field of the stored struct.
pub const KEY_FIELD: &str = "k";
/// Name of the count field of the stored struct.
pub const COUNT_FIELD: &str = "n";

/// The bucket index of a magnitude `a` in `[MIN_MAGNITUDE, MAX_MAGNITUDE]`:
/// `ceil(ln(a) / ln(gamma))`.
pub fn bucket_index(a: f64) -> i32 {
    // |ln a / ln gamma| <= 34538 for the accepted range, so the cast is exact.
    (a.ln() / GAMMA.ln()).ceil() as i32
}

/// The representative value of bucket index `i`: `2 * gamma^i / (gamma + 1)`.
pub fn representative(i: i32) -> f64 {
    2.0 * GAMMA.powf(f64::from(i)) / (GAMMA + 1.0)
}

/// The key of a value, or [`SketchError::RefusedValue`] for NaN, infinities and
/// magnitudes above [`MAX_MAGNITUDE`].
pub fn key_of(x: f64) -> Result<i32, SketchError> {
    let a = x.abs();
    if x.is_nan() || a > MAX_MAGNITUDE {
        return Err(SketchError::RefusedValue(x));
    }
    if a < MIN_MAGNITUDE {
        return Ok(0);
    }
    let k = KEY_OFFSET + bucket_index(a);
    Ok(if x > 0.0 { k } else { -k })
}

/// The value of a key (the representative of its bucket, `0` for key `0`).
///
/// Keys outside the valid ranges are not refused here; [`is_valid_key`] tells them.
pub fn value_of_key(k: i32) -> f64 {
    match k {
        0 => 0.0,
        k if k > 0 => representative(k - KEY_OFFSET),
        k => -representative(-(k + KEY_OFFSET)),
    }
}

/// Whether `k` is a key that [`key_of`] can produce.
pub fn is_valid_key(k: i32) -> bool {
    let i = i64::from(k).abs() - i64::from(KEY_OFFSET);
    k == 0 || (i64::from(MIN_INDEX)..=i64::from(MAX_INDEX)).contains(&i)
}

/// Dense counts over a contiguous range of bucket indices.
#[derive(Clone, Debug, Default)]
struct Store {
    /// Bucket index of `counts[0]`.
    offset: i32,
    counts: Vec<u64>,
}

impl Store {
    /// Adds `n` to bucket index `i` (in `[MIN_INDEX, MAX_INDEX]`).
    fn add(&mut self, i: i32, n: u64) {
        if self.counts.is_empty() {
            self.offset = i;
            self.counts.push(n);
            return;
        }
        let len = self.counts.len() as i64;
        let (offset, index) = (i64::from(self.offset), i64::from(i));
        // Grow with some slack so that a drifting range costs amortized O(1), but never past
        // the valid index range.
        let slack = (len / 2).max(16);
        if index < offset {
            let new_offset = (index - slack).max(i64::from(MIN_INDEX)).min(index);
            let mut counts = vec![0u64; (offset - new_offset) as usize];
            counts.extend_from_slice(&self.counts);
            self.counts = counts;
            // In [MIN_INDEX, MAX_INDEX], so it fits.
            self.offset = new_offset as i32;
        } else if index - offset >= len {
            let new_end = (index + slack).min(i64::from(MAX_INDEX)).max(index);
            self.counts.resize((new_end - offset + 1) as usize, 0);
        }
        let slot = &mut self.counts[(i - self.offset) as usize];
        *slot = slot.saturating_add(n);
    }

    /// Non-empty buckets as `(index, count)`, ascending.
    fn iter(&self) -> impl DoubleEndedIterator<Item = (i32, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(j, n)| (self.offset + j as i32, *n))
    }
}

/// A DDSketch-style quantile sketch with relative accuracy 1 % (see the
/// [module documentation](self)).
///
/// Counts saturate at `u64::MAX`. Equality compares the buckets only.
#[derive(Clone, Debug, Default)]
pub struct QuantileSketch {
    negative: Store,
    zero: u64,
    positive: Store,
    count: u64,
}

impl PartialEq for QuantileSketch {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.buckets().eq(other.buckets())
    }
}

impl QuantileSketch {
    /// An empty sketch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one value; refuses NaN, infinities and `|x| > 1e300` without changing the sketch.
    pub fn add(&mut self, x: f64) -> Result<(), SketchError> {
        self.add_n(x, 1)
    }

    /// Adds `n` copies of a value (see [`QuantileSketch::add`]).
    pub fn add_n(&mut self, x: f64, n: u64) -> Result<(), SketchError> {
        let k = key_of(x)?;
        self.add_key(k, n);
        Ok(())
    }

    /// Adds `n` to the bucket of a valid key (checked by the callers).
    fn add_key(&mut self, k: i32, n: u64) {
        if n == 0 {
            return;
        }
        match k {
            0 => self.zero = self.zero.saturating_add(n),
            k if k > 0 => self.positive.add(k - KEY_OFFSET, n),
            k => self.negative.add(-(k + KEY_OFFSET), n),
        }
        self.count = self.count.saturating_add(n);
    }

    /// Adds every non-null value of a numeric Arrow array (`Int8` … `Int64`,
    /// `UInt8` … `UInt64`, `Float16`, `Float32`, `Float64`; integers are converted to `f64`).
    ///
    /// Refused values (NaN, infinities, `|x| > 1e300`) are skipped and counted: the result is
    /// their number. Any other type returns [`SketchError::UnsupportedType`] and leaves the
    /// sketch unchanged.
    pub fn add_array(&mut self, array: &dyn Array) -> Result<u64, SketchError> {
        fn each<T: ArrowPrimitiveType>(
            s: &mut QuantileSketch,
            array: &dyn Array,
            to_f64: impl Fn(T::Native) -> f64,
        ) -> u64 {
            let mut refused = 0;
            for v in array.as_primitive::<T>().iter().flatten() {
                if s.add(to_f64(v)).is_err() {
                    refused += 1;
                }
            }
            refused
        }
        Ok(match array.data_type() {
            DataType::Int8 => each::<Int8Type>(self, array, f64::from),
            DataType::Int16 => each::<Int16Type>(self, array, f64::from),
            DataType::Int32 => each::<Int32Type>(self, array, f64::from),
            DataType::Int64 => each::<Int64Type>(self, array, |v| v as f64),
            DataType::UInt8 => each::<UInt8Type>(self, array, f64::from),
            DataType::UInt16 => each::<UInt16Type>(self, array, f64::from),
            DataType::UInt32 => each::<UInt32Type>(self, array, f64::from),
            DataType::UInt64 => each::<UInt64Type>(self, array, |v| v as f64),
            DataType::Float16 => each::<Float16Type>(self, array, |v| v.to_f64()),
            DataType::Float32 => each::<Float32Type>(self, array, f64::from),
            DataType::Float64 => each::<Float64Type>(self, array, |v| v),
            other => return Err(SketchError::UnsupportedType(other.clone())),
        })
    }

    /// Merges `other` into `self`: per key the sum of the counts.
    pub fn merge(&mut self, other: &QuantileSketch) {
        for (k, n) in other.buckets() {
            self.add_key(k, n);
        }
    }

    /// The total count `N`.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether no value has been added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The non-empty buckets as `(key, count)`, in ascending key (= value) order.
    pub fn buckets(&self) -> impl Iterator<Item = (i32, u64)> + '_ {
        let negative = self
            .negative
            .iter()
            .rev()
            .map(|(i, n)| (-(KEY_OFFSET + i), n));
        let zero = (self.zero > 0).then_some((0, self.zero));
        let positive = self.positive.iter().map(|(i, n)| (KEY_OFFSET + i, n));
        negative.chain(zero).chain(positive)
    }

    /// The estimate of quantile `q` (see the module documentation); `None` when the sketch is
    /// empty or `q` is not in `[0, 1]`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = q * (self.count - 1) as f64;
        let mut cumulative = 0u64;
        let mut last = None;
        for (k, n) in self.buckets() {
            cumulative = cumulative.saturating_add(n);
            if cumulative as f64 > rank {
                return Some(value_of_key(k));
            }
            last = Some(k);
        }
        // Only reachable through float rounding of huge counts.
        last.map(value_of_key)
    }

    /// Builds a sketch from stored `(k, n)` pairs.
    ///
    /// Requires valid keys ([`is_valid_key`]) and `n >= 0`; pairs may come in any order and
    /// repeat a key (the counts add up, as merging does); `n = 0` adds nothing. Writers emit
    /// each key once, sorted, with `n >= 1`.
    pub fn from_buckets(
        pairs: impl IntoIterator<Item = (i32, i64)>,
    ) -> Result<QuantileSketch, SketchError> {
        let mut sketch = QuantileSketch::new();
        for (k, n) in pairs {
            if !is_valid_key(k) {
                return Err(SketchError::InvalidData(format!(
                    "bucket key {k} out of range"
                )));
            }
            let n = u64::try_from(n)
                .map_err(|_| SketchError::InvalidData(format!("negative bucket count {n}")))?;
            sketch.add_key(k, n);
        }
        Ok(sketch)
    }
}

/// The Arrow type of the stored sketch column:
/// `List<element: Struct<k: Int32, n: Int64>>`.
pub fn data_type() -> DataType {
    pair_list_type::<Int64Type>(KEY_FIELD, COUNT_FIELD)
}

/// Whether a column of type `ty` holds stored sketches ([`data_type`], as a window's
/// `<name>_sketch` column is written and read back).
pub fn is_sketch_type(ty: &DataType) -> bool {
    is_pair_list::<Int64Type>(ty, KEY_FIELD, COUNT_FIELD)
}

/// Builds the stored column from sketches; `None` becomes a null list entry.
///
/// Each sketch becomes its non-empty buckets sorted by `k`. Accepts anything that iterates
/// over `Option<&QuantileSketch>`, `&Option<QuantileSketch>` (so a
/// `&[Option<QuantileSketch>]` or `&Vec<Option<QuantileSketch>>`) or `&QuantileSketch`. Fails when a
/// count exceeds `i64::MAX` or the batch holds more than `i32::MAX` buckets in total.
pub fn to_list_array<'a, I>(sketches: I) -> Result<ListArray, SketchError>
where
    I: IntoIterator,
    I::Item: Into<Option<&'a QuantileSketch>>,
{
    let mut builder = PairListBuilder::<Int64Type>::new(KEY_FIELD, COUNT_FIELD);
    for sketch in sketches {
        match sketch.into() {
            Some(s) => {
                if s.buckets().any(|(_, n)| i64::try_from(n).is_err()) {
                    return Err(SketchError::InvalidData(
                        "bucket count above i64::MAX".into(),
                    ));
                }
                builder.append(s.buckets().map(|(k, n)| (k, n as i64)));
            }
            None => builder.append_null(),
        }
    }
    builder.finish()
}

/// Reads the sketch stored in row `row` of a column built by [`to_list_array`] (or read back
/// from Parquet/Iceberg); `None` for a null entry.
pub fn from_list_array(
    array: &ListArray,
    row: usize,
) -> Result<Option<QuantileSketch>, SketchError> {
    let Some((k, n)) = read_pairs::<Int64Type>(array, row, KEY_FIELD, COUNT_FIELD)? else {
        return Ok(None);
    };
    QuantileSketch::from_buckets(k.values().iter().copied().zip(n.values().iter().copied()))
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float64Array, Int32Array, StringArray};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn index_constants() {
        assert_eq!(bucket_index(MIN_MAGNITUDE), MIN_INDEX);
        assert_eq!(bucket_index(MAX_MAGNITUDE), MAX_INDEX);
        assert_eq!(GAMMA, 1.01 / 0.99);
        assert_eq!(key_of(MAX_MAGNITUDE).unwrap(), 1_083_114);
        assert_eq!(key_of(MIN_MAGNITUDE).unwrap(), 1_014_039);
        assert_eq!(key_of(-MIN_MAGNITUDE).unwrap(), -1_014_039);
        assert!(value_of_key(KEY_OFFSET + MAX_INDEX).is_finite());
        assert!(value_of_key(KEY_OFFSET + MIN_INDEX) > 0.0);
    }

    #[test]
    fn refused_and_zero() {
        let mut s = QuantileSketch::new();
        for x in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1.1e300,
            -2e300,
            f64::MAX,
        ] {
            assert!(matches!(s.add(x), Err(SketchError::RefusedValue(_))), "{x}");
        }
        assert!(s.is_empty());
        for x in [0.0, -0.0, 1e-301, -1e-320, f64::MIN_POSITIVE] {
            assert_eq!(key_of(x).unwrap(), 0);
        }
        s.add(1e300).unwrap();
        s.add(-1e300).unwrap();
        assert_eq!(s.count(), 2);
    }

    #[test]
    fn keys_are_monotonic_over_the_range() {
        // Sweep magnitudes across the whole accepted range, both signs.
        let mut xs = Vec::new();
        let mut a = MIN_MAGNITUDE;
        while a <= MAX_MAGNITUDE {
            xs.push(a);
            xs.push(-a);
            a *= 1.003;
        }
        xs.push(MAX_MAGNITUDE);
        xs.push(-MAX_MAGNITUDE);
        xs.push(0.0);
        xs.sort_by(f64::total_cmp);
        let keys: Vec<i32> = xs.iter().map(|x| key_of(*x).unwrap()).collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]));
        let values: Vec<f64> = keys.iter().map(|k| value_of_key(*k)).collect();
        assert!(values.windows(2).all(|w| w[0] <= w[1]));
        for (x, v) in xs.iter().zip(&values) {
            if *x != 0.0 {
                assert!(
                    ((v - x) / x).abs() <= RELATIVE_ACCURACY + 1e-12,
                    "x={x} v={v}"
                );
            }
            assert!(is_valid_key(key_of(*x).unwrap()));
        }
        assert!(
            keys.iter()
                .all(|k| *k == 0 || k.unsigned_abs() >= 1_000_000)
        );
    }

    fn check_guarantee(values: &mut [f64], sketch: &QuantileSketch) {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        for q in [
            0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0,
        ] {
            let p = (q * (n - 1) as f64).floor() as usize;
            let truth = values[p];
            let est = sketch.quantile(q).unwrap();
            let err = if truth.abs() < MIN_MAGNITUDE {
                est.abs()
            } else {
                ((est - truth) / truth).abs()
            };
            assert!(
                err <= RELATIVE_ACCURACY + 1e-10,
                "q={q} truth={truth} est={est}"
            );
        }
    }

    #[test]
    fn guarantee_on_various_distributions() {
        let mut rng = StdRng::seed_from_u64(7);
        let gens: [fn(&mut StdRng) -> f64; 6] = [
            |r| r.random::<f64>(),
            |r| (r.random::<f64>() * 40.0 - 20.0).exp(),
            |r| r.random::<f64>() * 200.0 - 100.0,
            |r| {
                if r.random::<f64>() < 0.3 {
                    0.0
                } else {
                    -r.random::<f64>()
                }
            },
            |r| {
                let e = r.random_range(-300..=299) as f64;
                let s = if r.random::<bool>() { 1.0 } else { -1.0 };
                s * 10f64.powf(e) * r.random_range(1.0..10.0)
            },
            |r| r.random_range(0..5) as f64,
        ];
        for g in &gens {
            for n in [1usize, 2, 3, 17, 1000, 20_000] {
                let mut values: Vec<f64> = (0..n).map(|_| g(&mut rng)).collect();
                let mut s = QuantileSketch::new();
                for v in &values {
                    s.add(*v).unwrap();
                }
                assert_eq!(s.count(), n as u64);
                check_guarantee(&mut values, &s);
            }
        }
    }

    #[test]
    fn merge_is_union() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut all = QuantileSketch::new();
        let mut parts = vec![QuantileSketch::new(); 5];
        for j in 0..10_000 {
            let x = (rng.random::<f64>() * 30.0 - 15.0).exp() * if j % 3 == 0 { -1.0 } else { 1.0 };
            let x = if j % 11 == 0 { 0.0 } else { x };
            all.add(x).unwrap();
            parts[j % 5].add(x).unwrap();
        }
        let mut merged = QuantileSketch::new();
        for p in &parts {
            merged.merge(p);
        }
        assert_eq!(merged, all);
        for q in [0.0, 0.5, 0.99, 1.0] {
            assert_eq!(merged.quantile(q), all.quantile(q));
        }
    }

    #[test]
    fn quantile_definition() {
        let mut s = QuantileSketch::new();
        assert_eq!(s.quantile(0.5), None);
        for x in [1.0, 2.0, 3.0, 4.0] {
            s.add(x).unwrap();
        }
        // rank = 0.5 * 3 = 1.5 -> first cumulative count > 1.5 is 2 (value 2).
        let v = s.quantile(0.5).unwrap();
        assert!((v - 2.0).abs() <= 0.02);
        assert!((s.quantile(1.0).unwrap() - 4.0).abs() <= 0.04);
        assert!((s.quantile(0.0).unwrap() - 1.0).abs() <= 0.01);
        assert_eq!(s.quantile(1.5), None);
        assert_eq!(s.quantile(f64::NAN), None);
        s.add_n(-5.0, 10).unwrap();
        assert!((s.quantile(0.5).unwrap() + 5.0).abs() <= 0.05);
    }

    #[test]
    fn arrow_round_trip_and_add_array() {
        let mut a = QuantileSketch::new();
        let refused = a
            .add_array(&Float64Array::from(vec![
                Some(1.5),
                None,
                Some(f64::NAN),
                Some(-2.0),
                Some(0.0),
            ]))
            .unwrap();
        assert_eq!(refused, 1);
        assert_eq!(a.count(), 3);
        let mut b = QuantileSketch::new();
        b.add_array(&Int32Array::from(vec![3, 3, -7])).unwrap();
        assert!(matches!(
            b.add_array(&StringArray::from(vec!["x"])),
            Err(SketchError::UnsupportedType(_))
        ));
        let empty = QuantileSketch::new();
        let arr = to_list_array([Some(&a), None, Some(&b), Some(&empty)]).unwrap();
        assert_eq!(arr.data_type(), &data_type());
        assert_eq!(from_list_array(&arr, 0).unwrap(), Some(a.clone()));
        assert_eq!(from_list_array(&arr, 1).unwrap(), None);
        assert_eq!(from_list_array(&arr, 2).unwrap(), Some(b));
        assert_eq!(from_list_array(&arr, 3).unwrap(), Some(empty));
        let row = arr.value(0);
        let keys = row
            .as_struct()
            .column(0)
            .as_primitive::<Int32Type>()
            .clone();
        assert!(keys.values().windows(2).all(|w| w[0] < w[1]));
        assert_eq!(keys.value(1), 0);
        // Invalid stored data.
        assert!(QuantileSketch::from_buckets([(5, 1)]).is_err());
        assert!(QuantileSketch::from_buckets([(0, -1)]).is_err());
        let hll = crate::hll::to_list_array([Some(&crate::HyperLogLog::new())]).unwrap();
        assert!(matches!(
            from_list_array(&hll, 0),
            Err(SketchError::InvalidSchema(_))
        ));
        // The layout is recognised whatever the list item is called; nothing else is.
        assert!(is_sketch_type(&data_type()));
        let DataType::List(item) = data_type() else {
            unreachable!()
        };
        let renamed = DataType::List(std::sync::Arc::new(arrow_schema::Field::new(
            "item",
            item.data_type().clone(),
            true,
        )));
        assert!(is_sketch_type(&renamed));
        assert!(!is_sketch_type(hll.data_type()));
        assert!(!is_sketch_type(&DataType::Float64));
    }
}
