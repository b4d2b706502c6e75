//! The rollup table contract: what a window operator records in the properties of the table
//! its rollup lands in, so that `floe-maintenance merge` can fold the partial rows of closed
//! windows without knowing the job.
//!
//! A rollup row is a partial aggregate of one (window, key, source partition). The job records
//! in each commit marker, next to each source partition's position, the partition's watermark
//! for the operator (`"{partition}#wm:{operator}"`, µs). Once that watermark reaches
//! `window_end + allowed_lateness`, the job never changes the row again, and rows of the same
//! (window, key) may be replaced by one row whose `source_partition` is [`MERGED_PARTITION`]
//! and whose columns follow each column's [`MergeRule`].

use std::fmt;
use std::str::FromStr;

/// Table property: the id of the window operator whose rollup the table holds.
pub const OPERATOR: &str = "floe.rollup.operator";
/// Table property: the operator's allowed lateness in µs (decimal).
pub const ALLOWED_LATENESS: &str = "floe.rollup.allowed-lateness-us";
/// Table property: every column with its merge rule, a JSON array of `[column, rule]`.
pub const COLUMNS: &str = "floe.rollup.columns";
/// The `source_partition` of a row merged from several partitions' partials.
pub const MERGED_PARTITION: &str = "*";

/// How one rollup column is combined when partial rows merge.
#[derive(Debug, Clone, PartialEq)]
pub enum MergeRule {
    /// Part of the group: the window bounds and the key columns.
    Group,
    /// The source partition (`*` once merged).
    Partition,
    /// The sum of the partials (counts and sums).
    Sum,
    /// The smallest non-null value.
    Min,
    /// The largest non-null value.
    Max,
    /// A HyperLogLog column: the register-wise maximum.
    Hll,
    /// A quantile sketch column: the bucket-wise sum.
    Sketch,
    /// An average: the merged `sum` column divided by the merged `count` column.
    Avg {
        /// The sum column.
        sum: String,
        /// The count column.
        count: String,
    },
    /// A distinct count: the estimate of the merged HyperLogLog column.
    Distinct {
        /// The sketch column.
        hll: String,
    },
    /// A quantile: read off the merged sketch column.
    Quantile {
        /// The sketch column.
        sketch: String,
        /// The quantile, in [0, 1].
        q: f64,
    },
    /// A pick (`max_by`): the value of the partial whose `by` column is largest (ties: the
    /// largest value).
    MaxBy {
        /// The column picked by.
        by: String,
    },
}

/// The order of `max_by` picks — by `by`, ties to the larger value — which every pick of a
/// window, every merge of partial picks and every reader of them follows.
pub fn pick_order(a: (f64, &str), b: (f64, &str)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1))
}

impl fmt::Display for MergeRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MergeRule::Group => f.write_str("group"),
            MergeRule::Partition => f.write_str("partition"),
            MergeRule::Sum => f.write_str("sum"),
            MergeRule::Min => f.write_str("min"),
            MergeRule::Max => f.write_str("max"),
            MergeRule::Hll => f.write_str("hll"),
            MergeRule::Sketch => f.write_str("sketch"),
            MergeRule::Avg { sum, count } => write!(f, "avg:{sum}:{count}"),
            MergeRule::Distinct { hll } => write!(f, "distinct:{hll}"),
            MergeRule::Quantile { sketch, q } => write!(f, "quantile:{sketch}:{q}"),
            MergeRule::MaxBy { by } => write!(f, "max_by:{by}"),
        }
    }
}

impl FromStr for MergeRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("unknown merge rule {s:?}");
        Ok(match s {
            "group" => MergeRule::Group,
            "partition" => MergeRule::Partition,
            "sum" => MergeRule::Sum,
            "min" => MergeRule::Min,
            "max" => MergeRule::Max,
            "hll" => MergeRule::Hll,
            "sketch" => MergeRule::Sketch,
            _ => {
                let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
                match kind {
                    "avg" => {
                        let (sum, count) = rest.rsplit_once(':').ok_or_else(bad)?;
                        MergeRule::Avg {
                            sum: sum.to_string(),
                            count: count.to_string(),
                        }
                    }
                    "distinct" => MergeRule::Distinct {
                        hll: rest.to_string(),
                    },
                    "max_by" => MergeRule::MaxBy {
                        by: rest.to_string(),
                    },
                    "quantile" => {
                        let (sketch, q) = rest.rsplit_once(':').ok_or_else(bad)?;
                        MergeRule::Quantile {
                            sketch: sketch.to_string(),
                            q: q.parse().map_err(|_| bad())?,
                        }
                    }
                    _ => return Err(bad()),
                }
            }
        })
    }
}

/// A rollup table's merge plan, as its properties record it.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupPlan {
    /// The window operator.
    pub operator: String,
    /// Its allowed lateness (µs).
    pub allowed_lateness: i64,
    /// Every column with its rule, in table order.
    pub columns: Vec<(String, MergeRule)>,
}

impl RollupPlan {
    /// The table properties that record this plan.
    pub fn to_properties(&self) -> Vec<(String, String)> {
        let columns: Vec<(String, String)> = self
            .columns
            .iter()
            .map(|(c, r)| (c.clone(), r.to_string()))
            .collect();
        vec![
            (OPERATOR.to_string(), self.operator.clone()),
            (
                ALLOWED_LATENESS.to_string(),
                self.allowed_lateness.to_string(),
            ),
            (
                COLUMNS.to_string(),
                serde_json::to_string(&columns).unwrap_or_default(),
            ),
        ]
    }

    /// The plan recorded in `properties`: `None` when the table is no rollup, an error when
    /// the properties are malformed.
    pub fn from_properties(
        properties: &std::collections::HashMap<String, String>,
    ) -> Option<Result<Self, String>> {
        let columns = properties.get(COLUMNS)?;
        Some((|| {
            let operator = properties
                .get(OPERATOR)
                .ok_or_else(|| format!("property {OPERATOR} is missing"))?
                .clone();
            let allowed_lateness = properties
                .get(ALLOWED_LATENESS)
                .ok_or_else(|| format!("property {ALLOWED_LATENESS} is missing"))?
                .parse()
                .map_err(|_| format!("property {ALLOWED_LATENESS} is not an integer"))?;
            let pairs: Vec<(String, String)> = serde_json::from_str(columns)
                .map_err(|e| format!("property {COLUMNS} is not a list of pairs: {e}"))?;
            let columns = pairs
                .into_iter()
                .map(|(c, r)| Ok((c, r.parse()?)))
                .collect::<Result<_, String>>()?;
            Ok(Self {
                operator,
                allowed_lateness,
                columns,
            })
        })())
    }

    /// The committed-watermark entry of `partition` for this operator in a marker's positions.
    pub fn watermark_entry(&self, partition: &str) -> String {
        format!("{partition}{WATERMARK}{}", self.operator)
    }
}

/// The infix of a watermark entry in a partition's positions: `"{partition}#wm:{operator}"`.
pub const WATERMARK: &str = "#wm:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_round_trip_through_properties() {
        let plan = RollupPlan {
            operator: "rollup".into(),
            allowed_lateness: 5_000_000,
            columns: vec![
                ("window_start".into(), MergeRule::Group),
                ("source_partition".into(), MergeRule::Partition),
                ("n".into(), MergeRule::Sum),
                (
                    "mean".into(),
                    MergeRule::Avg {
                        sum: "mean_sum".into(),
                        count: "mean_count".into(),
                    },
                ),
                (
                    "p99".into(),
                    MergeRule::Quantile {
                        sketch: "p99_sketch".into(),
                        q: 0.99,
                    },
                ),
                (
                    "users".into(),
                    MergeRule::Distinct {
                        hll: "users_hll".into(),
                    },
                ),
                (
                    "slowest".into(),
                    MergeRule::MaxBy {
                        by: "slowest_by".into(),
                    },
                ),
                ("slowest_by".into(), MergeRule::Max),
            ],
        };
        let properties = plan.to_properties().into_iter().collect();
        assert_eq!(RollupPlan::from_properties(&properties), Some(Ok(plan)));
        assert_eq!(
            RollupPlan::from_properties(&Default::default()),
            None,
            "a table without the columns property is no rollup"
        );
    }

    #[test]
    fn malformed_properties_are_errors() {
        let mut properties: std::collections::HashMap<String, String> = [
            (OPERATOR.to_string(), "w".to_string()),
            (ALLOWED_LATENESS.to_string(), "0".to_string()),
            (COLUMNS.to_string(), r#"[["a","median"]]"#.to_string()),
        ]
        .into();
        let err = RollupPlan::from_properties(&properties)
            .unwrap()
            .unwrap_err();
        assert!(err.contains("unknown merge rule \"median\""), "{err}");
        properties.insert(ALLOWED_LATENESS.into(), "soon".into());
        let err = RollupPlan::from_properties(&properties)
            .unwrap()
            .unwrap_err();
        assert!(err.contains("not an integer"), "{err}");
    }
}
