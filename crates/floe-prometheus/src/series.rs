//! Rows as Prometheus series: each row gives one sample per value column, at the row's time,
//! in the series named `<metric>_<column>` with the row's text columns as labels.
//!
//! * **Time** is the `time` column (default `window_end`, else `window_start`, else the first
//!   timestamp column): a per-minute row's value holds as of its minute's end.
//! * **Labels** are the `labels` columns (default: every text column); a null or empty value
//!   leaves the label out, as Prometheus does.
//! * **Values** are the `values` columns, cast to float; a null value is no sample. NaN and
//!   infinities go as they are (Prometheus stores them).
//! * Names are made valid: any character outside `[a-zA-Z0-9_:]` becomes `_`.
//! * Two rows of one series at one time: the later row's value is sent.

use std::collections::BTreeMap;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, TimestampMillisecondType};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};

use crate::wire::{Label, Sample, TimeSeries};

/// How rows become samples (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesSpec {
    /// The metric name prefix.
    pub metric: String,
    /// The time column.
    pub time: Option<String>,
    /// The label columns (`None`: every text column).
    pub labels: Option<Vec<String>>,
    /// The value columns.
    pub values: Vec<String>,
}

/// A name Prometheus accepts.
pub(crate) fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) || out.is_empty() {
        out.insert(0, '_');
    }
    out
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// The samples of `batches`, by series (labels sorted, `__name__` among them).
pub(crate) fn series(
    batches: &[RecordBatch],
    spec: &SeriesSpec,
) -> Result<BTreeMap<Vec<Label>, BTreeMap<i64, f64>>, String> {
    let mut out: BTreeMap<Vec<Label>, BTreeMap<i64, f64>> = BTreeMap::new();
    for batch in batches {
        let schema = batch.schema();
        let time_name = match &spec.time {
            Some(t) => t.clone(),
            None => ["window_end", "window_start"]
                .iter()
                .map(|n| n.to_string())
                .find(|n| schema.field_with_name(n).is_ok())
                .or_else(|| {
                    schema
                        .fields()
                        .iter()
                        .find(|f| matches!(f.data_type(), DataType::Timestamp(..)))
                        .map(|f| f.name().clone())
                })
                .ok_or("the rows have no timestamp column; name one in `time`")?,
        };
        let time = batch
            .column_by_name(&time_name)
            .ok_or_else(|| format!("no time column {time_name:?}"))?;
        let time = arrow_cast::cast(time, &DataType::Timestamp(TimeUnit::Millisecond, None))
            .map_err(|e| format!("time column {time_name:?}: {e}"))?;
        let time = time.as_primitive::<TimestampMillisecondType>();
        let label_names: Vec<String> = match &spec.labels {
            Some(l) => l.clone(),
            None => schema
                .fields()
                .iter()
                .filter(|f| is_text(f.data_type()))
                .map(|f| f.name().clone())
                .collect(),
        };
        let mut labels = Vec::with_capacity(label_names.len());
        for name in &label_names {
            let column = batch
                .column_by_name(name)
                .ok_or_else(|| format!("no label column {name:?}"))?;
            let column = arrow_cast::cast(column, &DataType::Utf8)
                .map_err(|e| format!("label column {name:?}: {e}"))?;
            labels.push((sanitize(name), column));
        }
        let mut values = Vec::with_capacity(spec.values.len());
        for name in &spec.values {
            let column = batch
                .column_by_name(name)
                .ok_or_else(|| format!("no value column {name:?}"))?;
            let column = arrow_cast::cast(column, &DataType::Float64)
                .map_err(|e| format!("value column {name:?}: {e}"))?;
            values.push((sanitize(&format!("{}_{name}", spec.metric)), column));
        }
        for row in 0..batch.num_rows() {
            if time.is_null(row) {
                continue;
            }
            let at = time.value(row);
            let mut common: Vec<Label> = labels
                .iter()
                .filter(|(_, c)| c.is_valid(row))
                .map(|(name, c)| Label {
                    name: name.clone(),
                    value: c.as_string::<i32>().value(row).to_string(),
                })
                .filter(|l| !l.value.is_empty())
                .collect();
            common.push(Label {
                name: "__name__".into(),
                value: String::new(),
            });
            for (metric, column) in &values {
                if column.is_null(row) {
                    continue;
                }
                let value = column.as_primitive::<Float64Type>().value(row);
                let mut key = common.clone();
                key.last_mut().expect("__name__").value = metric.clone();
                key.sort();
                out.entry(key).or_default().insert(at, value);
            }
        }
    }
    Ok(out)
}

/// The series as the wire wants them: samples in time order.
pub(crate) fn to_wire(series: BTreeMap<Vec<Label>, BTreeMap<i64, f64>>) -> Vec<TimeSeries> {
    series
        .into_iter()
        .map(|(labels, samples)| TimeSeries {
            labels,
            samples: samples
                .into_iter()
                .map(|(timestamp, value)| Sample { value, timestamp })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float64Array, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow_schema::{Field, Schema};

    use super::*;

    #[test]
    fn rows_become_one_sample_per_value_column() {
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "window_end",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                false,
            ),
            Field::new("slo", DataType::Utf8, false),
            Field::new("service.name", DataType::Utf8, true),
            Field::new("burn", DataType::Float64, true),
            Field::new("total", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(
                    TimestampMicrosecondArray::from(vec![60_000_000, 120_000_000, 120_000_000])
                        .with_timezone("+00:00"),
                ),
                Arc::new(StringArray::from(vec!["a", "a", "b"])),
                Arc::new(StringArray::from(vec![Some("x"), Some("x"), None])),
                Arc::new(Float64Array::from(vec![Some(0.5), None, Some(f64::NAN)])),
                Arc::new(Int64Array::from(vec![10, 20, 30])),
            ],
        )
        .unwrap();
        let spec = SeriesSpec {
            metric: "floe slo".into(),
            time: None,
            labels: None,
            values: vec!["burn".into(), "total".into()],
        };
        let got = series(&[batch], &spec).unwrap();
        let label = |n: &str, v: &str| Label {
            name: n.into(),
            value: v.into(),
        };
        let a_burn = vec![
            label("__name__", "floe_slo_burn"),
            label("service_name", "x"),
            label("slo", "a"),
        ];
        assert_eq!(got[&a_burn], BTreeMap::from([(60_000, 0.5)]));
        let a_total = vec![
            label("__name__", "floe_slo_total"),
            label("service_name", "x"),
            label("slo", "a"),
        ];
        assert_eq!(
            got[&a_total],
            BTreeMap::from([(60_000, 10.0), (120_000, 20.0)])
        );
        // A null label is left out; NaN is a sample.
        let b_burn = vec![label("__name__", "floe_slo_burn"), label("slo", "b")];
        assert!(got[&b_burn][&120_000].is_nan());
        assert_eq!(got.len(), 4);
        assert_eq!(sanitize("9lives"), "_9lives");
    }
}
