//! Stateless operators on DataFusion expressions: `filter` (a `WHERE` predicate) and `select`
//! (columns computed by SQL expressions, with `AS` names, `*` for every input column, and an
//! optional `WHERE`).
//!
//! The statement `SELECT {columns} FROM input [WHERE {predicate}]` is planned once with
//! DataFusion against the input stream's columns; each batch is then evaluated with the
//! physical expressions — no query per batch. The plan is made again if a stream's columns
//! change (a change stream that gained a column).
//!
//! **Changelog inputs** stay changelogs: a select must keep the key columns as they are, and
//! a row of a key that no longer passes the filter becomes a delete of the key (`-D`), so
//! the landed table never keeps a row the filter would now refuse.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int8Type;
use arrow_array::{Array, ArrayRef, BooleanArray, Int8Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::MemTable;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{ExprSchemable, LogicalPlan};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;
use floe_core::{OP_COLUMN, Op, StreamBatch, StreamSpec, UNCHANGED_COLUMN};

use crate::window::iceberg_schema;
use crate::{Context, OpError, OpResult, Operator, filter_runs};

/// A planned statement.
struct Plan {
    /// The input columns it was planned for (without changelog columns).
    input: SchemaRef,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    /// `None`: every input column as it is.
    columns: Option<Vec<Arc<dyn PhysicalExpr>>>,
    output: SchemaRef,
}

/// A `filter` or a `select`.
pub struct Sql {
    id: String,
    columns: Option<Vec<String>>,
    predicate: Option<String>,
    changelog: bool,
    plan: Plan,
    outputs: Vec<StreamSpec>,
}

impl std::fmt::Debug for Sql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sql")
            .field("id", &self.id)
            .field("columns", &self.columns)
            .field("predicate", &self.predicate)
            .finish_non_exhaustive()
    }
}

/// `filter` and `select` are one operator with or without columns.
pub type Filter = Sql;
/// See [`Filter`].
pub type Select = Sql;

fn without_changelog_columns(schema: &Schema) -> Schema {
    Schema::new(
        schema
            .fields()
            .iter()
            .filter(|f| f.name() != OP_COLUMN && f.name() != UNCHANGED_COLUMN)
            .map(|f| Field::new(f.name(), f.data_type().clone(), f.is_nullable()))
            .collect::<Vec<_>>(),
    )
}

/// Plans `SELECT {columns} FROM input [WHERE {predicate}]` over `input`.
fn plan(
    input: &Schema,
    columns: Option<&[String]>,
    predicate: Option<&str>,
) -> Result<Plan, String> {
    let input: SchemaRef = Arc::new(without_changelog_columns(input));
    let ctx = SessionContext::new();
    let table = MemTable::try_new(input.clone(), vec![vec![]]).map_err(|e| e.to_string())?;
    ctx.register_table("input", Arc::new(table))
        .map_err(|e| e.to_string())?;
    let select = columns.map_or_else(|| "*".to_string(), |c| c.join(", "));
    let mut sql = format!("SELECT {select} FROM input");
    if let Some(p) = predicate {
        sql.push_str(&format!(" WHERE {p}"));
    }
    let state = ctx.state();
    let logical = futures::executor::block_on(state.create_logical_plan(&sql))
        .map_err(|e| e.strip_backtrace().to_string())?;
    let LogicalPlan::Projection(projection) = logical else {
        return Err(format!("{sql} is not a projection"));
    };
    let (predicate, scan) = match projection.input.as_ref() {
        LogicalPlan::Filter(filter) => (Some(filter.predicate.clone()), filter.input.clone()),
        other => (None, Arc::new(other.clone())),
    };
    if !matches!(scan.as_ref(), LogicalPlan::TableScan(_)) {
        return Err(format!(
            "{sql} reads more than the input (joins, subqueries and aggregates are not stream operators)"
        ));
    }
    let scan_schema = scan.schema();
    // Simplified first, as DataFusion's optimizer would: some functions (coalesce, nvl) are
    // rewritten there and have no physical form of their own.
    let simplifier = ExprSimplifier::new(
        SimplifyContext::builder()
            .with_schema(scan_schema.clone())
            .build(),
    );
    let physical = |e: datafusion::logical_expr::Expr| {
        let e = simplifier
            .simplify(e)
            .map_err(|e| e.strip_backtrace().to_string())?;
        ctx.create_physical_expr(e, scan_schema)
            .map_err(|e| e.strip_backtrace().to_string())
    };
    let predicate = predicate
        .map(|p| {
            if p.get_type(scan_schema).map_err(|e| e.to_string())? != DataType::Boolean {
                return Err(format!("the condition {p} is not true or false"));
            }
            physical(p)
        })
        .transpose()?;
    let output: SchemaRef = Arc::new(projection.schema.as_arrow().clone());
    let exprs = match columns {
        None => None,
        Some(_) => Some(
            projection
                .expr
                .iter()
                .map(|e| physical(e.clone()))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(Plan {
        input,
        predicate,
        columns: exprs,
        output,
    })
}

impl Sql {
    /// An operator `id` reading `input` and producing stream `output`: its rows where
    /// `predicate` holds, as `columns` (every column when `None`).
    pub fn new(
        id: &str,
        input: &StreamSpec,
        output: &str,
        columns: Option<Vec<String>>,
        predicate: Option<String>,
    ) -> Result<Self, String> {
        if columns.is_some() && floe_core::exchange::is_exchanged(input) {
            // Its rows carry their sources' clocks, which a new set of columns would lose.
            return Err(format!(
                "stream {} is read back from an exchange: a select cannot read it (a filter \
                 can); select before the exchange",
                input.name
            ));
        }
        let iceberg = input
            .schema
            .as_ref()
            .ok_or_else(|| format!("the columns of stream {} are not known yet", input.name))?;
        let arrow = iceberg::arrow::schema_to_arrow_schema(iceberg).map_err(|e| e.to_string())?;
        let plan = plan(&arrow, columns.as_deref(), predicate.as_deref())?;
        if input.changelog {
            for k in &input.key {
                let kept = plan.output.column_with_name(k).is_some_and(|(_, f)| {
                    arrow
                        .column_with_name(k)
                        .is_some_and(|(_, i)| i.data_type() == f.data_type())
                });
                if !kept {
                    return Err(format!(
                        "stream {} is a changelog keyed by {}: a select over it keeps its key \
                         column {k} as it is",
                        input.name,
                        input.key.join(", ")
                    ));
                }
            }
        }
        let key_refs: Vec<&str> = input.key.iter().map(String::as_str).collect();
        let schema = iceberg_schema(&plan.output, if input.changelog { &key_refs } else { &[] })?;
        let time_column = input
            .time_column
            .clone()
            .filter(|t| plan.output.column_with_name(t).is_some());
        let partition = input
            .partition
            .iter()
            .filter(|(c, _)| plan.output.column_with_name(c).is_some())
            .cloned()
            .collect();
        let outputs = vec![StreamSpec {
            name: output.to_string(),
            table: output.to_string(),
            schema: Some(schema),
            changelog: input.changelog,
            key: input.key.clone(),
            time_column,
            partition,
            bloom_filter_columns: input.bloom_filter_columns.clone(),
            plain_columns: input.plain_columns.clone(),
            properties: floe_core::exchange::exchanged_property(input),
        }];
        Ok(Self {
            id: id.to_string(),
            columns,
            predicate,
            changelog: input.changelog,
            plan,
            outputs,
        })
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.id.clone(),
            message: message.into(),
        }
    }

    /// Plans again when the rows' columns are not the ones planned for.
    fn replan_for(&mut self, schema: &Schema) -> OpResult<()> {
        let columns = without_changelog_columns(schema);
        let same = columns.fields().len() == self.plan.input.fields().len()
            && columns
                .fields()
                .iter()
                .zip(self.plan.input.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same {
            self.plan = plan(schema, self.columns.as_deref(), self.predicate.as_deref())
                .map_err(|e| self.invalid(e))?;
        }
        Ok(())
    }
}

/// SQL expressions and a condition over a stream's rows, planned once — what an `alerts`
/// rule evaluates on the rows of its stream.
pub(crate) struct Expressions {
    plan: Plan,
}

impl Expressions {
    /// `columns` where `predicate` holds, over rows of `input`'s columns (rows may carry more
    /// columns after them).
    pub(crate) fn new(
        input: &Schema,
        columns: &[String],
        predicate: Option<&str>,
    ) -> Result<Self, String> {
        Ok(Self {
            plan: plan(input, Some(columns), predicate)?,
        })
    }

    /// The rows of `batch` where the condition holds, and each column's values at them.
    pub(crate) fn evaluate(
        &self,
        batch: &RecordBatch,
    ) -> Result<(Vec<u32>, Vec<ArrayRef>), String> {
        let df = |e: datafusion::error::DataFusionError| e.strip_backtrace().to_string();
        let rows: Vec<u32> = match &self.plan.predicate {
            Some(p) => {
                let keep = mask(p, batch).map_err(df)?;
                (0..batch.num_rows() as u32)
                    .filter(|r| keep.value(*r as usize))
                    .collect()
            }
            None => (0..batch.num_rows() as u32).collect(),
        };
        let take = arrow_array::UInt32Array::from(rows.clone());
        let mut columns = Vec::new();
        for e in self.plan.columns.iter().flatten() {
            let all = e
                .evaluate(batch)
                .and_then(|v| v.into_array(batch.num_rows()))
                .map_err(df)?;
            columns.push(
                arrow_select::take::take(all.as_ref(), &take, None).map_err(|e| e.to_string())?,
            );
        }
        Ok((rows, columns))
    }
}

fn mask(
    predicate: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
) -> datafusion::error::Result<BooleanArray> {
    let value = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
    let mask = value.as_boolean();
    // NULL is not true.
    Ok(if mask.null_count() > 0 {
        arrow_select::filter::prep_null_mask_filter(mask)
    } else {
        mask.clone()
    })
}

impl Operator for Sql {
    fn id(&self) -> &str {
        &self.id
    }

    fn outputs(&self) -> &[StreamSpec] {
        &self.outputs
    }

    fn on_input(&mut self, input: &StreamSpec) -> Result<(), String> {
        let rebuilt = Sql::new(
            &self.id,
            input,
            &self.outputs[0].name,
            self.columns.clone(),
            self.predicate.clone(),
        )?;
        *self = rebuilt;
        Ok(())
    }

    fn on_batch(&mut self, input: &StreamBatch, ctx: &mut Context<'_>) -> OpResult<()> {
        self.replan_for(&input.batch.schema())?;
        let batch = &input.batch;
        let df =
            |e: datafusion::error::DataFusionError| self.invalid(e.strip_backtrace().to_string());
        let keep = match &self.plan.predicate {
            Some(p) => Some(mask(p, batch).map_err(df)?),
            None => None,
        };
        // A changelog keeps every row; a refused image deletes its key.
        let (rows, runs, ops) = match (&keep, self.changelog) {
            (Some(keep), false) => (
                arrow_select::filter::filter_record_batch(batch, keep)
                    .map_err(|e| self.invalid(e.to_string()))?,
                filter_runs(&input.runs, keep),
                None,
            ),
            (Some(keep), true) => {
                let ops = batch
                    .column_by_name(OP_COLUMN)
                    .ok_or_else(|| self.invalid("a changelog batch without ops"))?
                    .as_primitive::<Int8Type>();
                let changed: Int8Array = ops
                    .iter()
                    .zip(keep.iter())
                    .map(|(op, kept)| {
                        let op = op.and_then(Op::from_code)?;
                        Some(if op.is_image() && kept != Some(true) {
                            Op::Delete.code()
                        } else {
                            op.code()
                        })
                    })
                    .collect();
                (
                    batch.clone(),
                    input.runs.clone(),
                    Some(Arc::new(changed) as ArrayRef),
                )
            }
            (None, _) => (batch.clone(), input.runs.clone(), None),
        };
        let mut out = match &self.plan.columns {
            None => rows
                .project(
                    &(0..rows.num_columns())
                        .filter(|i| {
                            let name = rows.schema().field(*i).name().clone();
                            name != OP_COLUMN && name != UNCHANGED_COLUMN
                        })
                        .collect::<Vec<_>>(),
                )
                .map_err(|e| self.invalid(e.to_string()))?,
            Some(exprs) => {
                let arrays = exprs
                    .iter()
                    .map(|e| {
                        e.evaluate(&rows)
                            .and_then(|v| v.into_array(rows.num_rows()))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(df)?;
                RecordBatch::try_new(self.plan.output.clone(), arrays)
                    .map_err(|e| self.invalid(e.to_string()))?
            }
        };
        if self.changelog {
            let ops = match ops {
                Some(ops) => ops,
                None => rows
                    .column_by_name(OP_COLUMN)
                    .cloned()
                    .ok_or_else(|| self.invalid("a changelog batch without ops"))?,
            };
            let mut fields: Vec<Field> = out
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            let mut columns = out.columns().to_vec();
            fields.push(Field::new(OP_COLUMN, DataType::Int8, false));
            columns.push(ops);
            if let Some(unchanged) = rows.column_by_name(UNCHANGED_COLUMN) {
                fields.push(Field::new(UNCHANGED_COLUMN, DataType::Utf8, true));
                columns.push(unchanged.clone());
            }
            out = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
                .map_err(|e| self.invalid(e.to_string()))?;
        }
        ctx.emit(
            0,
            StreamBatch {
                stream: 0,
                batch: out,
                runs,
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};
    use floe_core::PartitionRun;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    fn spec(changelog: bool) -> StreamSpec {
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::required(
                    1,
                    "id",
                    Type::Primitive(PrimitiveType::Long),
                )),
                Arc::new(NestedField::optional(
                    2,
                    "name",
                    Type::Primitive(PrimitiveType::String),
                )),
            ])
            .with_identifier_field_ids(if changelog { vec![1] } else { vec![] })
            .build()
            .unwrap();
        StreamSpec {
            changelog,
            key: if changelog { vec!["id".into()] } else { vec![] },
            ..StreamSpec::append("rows", "rows", schema)
        }
    }

    fn rows(ops: Option<Vec<i8>>) -> StreamBatch {
        let mut columns: Vec<(&str, ArrayRef)> = vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2, 3, 4]))),
            (
                "name",
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    Some("bb"),
                    None,
                    Some("dddd"),
                ])),
            ),
        ];
        if let Some(ops) = ops {
            columns.push((OP_COLUMN, Arc::new(Int8Array::from(ops))));
        }
        StreamBatch {
            stream: 0,
            batch: RecordBatch::try_from_iter(columns).unwrap(),
            runs: vec![
                PartitionRun {
                    partition: 0,
                    rows: 2,
                },
                PartitionRun {
                    partition: 1,
                    rows: 2,
                },
            ],
        }
    }

    fn run(op: &mut Sql, input: &StreamBatch) -> StreamBatch {
        let names = |_| String::new();
        let mut ctx = Context::new(None, 0, &names);
        op.on_batch(input, &mut ctx).unwrap();
        let (mut out, dead) = ctx.finish();
        assert!(dead.is_empty());
        out.remove(0).1
    }

    #[test]
    fn filter_keeps_matching_rows_and_their_partitions() {
        let mut f = Sql::new(
            "f",
            &spec(false),
            "kept",
            None,
            Some("length(name) > 1".into()),
        )
        .unwrap();
        let out = run(&mut f, &rows(None));
        let ids = out
            .batch
            .column(0)
            .as_primitive::<arrow_array::types::Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, vec![2, 4], "NULL is not true");
        assert_eq!(
            out.runs,
            vec![
                PartitionRun {
                    partition: 0,
                    rows: 1
                },
                PartitionRun {
                    partition: 1,
                    rows: 1
                }
            ]
        );
        assert!(
            Sql::new("f", &spec(false), "x", None, Some("name".into())).is_err(),
            "not a condition"
        );
        assert!(Sql::new("f", &spec(false), "x", None, Some("nope = 1".into())).is_err());
    }

    #[test]
    fn select_computes_columns_with_names() {
        let mut s = Sql::new(
            "s",
            &spec(false),
            "derived",
            Some(vec![
                "id * 10 AS tens".into(),
                "upper(name) AS shout".into(),
                "coalesce(CASE WHEN id = 2 THEN NULL ELSE name END, 'none') AS named".into(),
            ]),
            Some("id > 1".into()),
        )
        .unwrap();
        let out = run(&mut s, &rows(None));
        assert_eq!(out.batch.schema().field(0).name(), "tens");
        let tens = out
            .batch
            .column(0)
            .as_primitive::<arrow_array::types::Int64Type>()
            .values()
            .to_vec();
        assert_eq!(tens, vec![20, 30, 40]);
        assert_eq!(out.batch.column(1).as_string::<i32>().value(2), "DDDD");
        // coalesce, which DataFusion rewrites before it can run.
        let named: Vec<&str> = out
            .batch
            .column(2)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        assert_eq!(named[0], "none");
        assert_eq!(named.len(), 3);
        let schema = s.outputs()[0].schema.clone().unwrap();
        assert!(schema.field_by_name("shout").is_some());
    }

    #[test]
    fn changelog_filters_turn_refused_images_into_deletes() {
        let mut f = Sql::new("f", &spec(true), "kept", None, Some("name <> 'bb'".into())).unwrap();
        let out = run(&mut f, &rows(Some(vec![0, 2, 3, 0])));
        let ops = out
            .batch
            .column_by_name(OP_COLUMN)
            .unwrap()
            .as_primitive::<Int8Type>()
            .values()
            .to_vec();
        // 'bb' fails → its +U becomes -D; NULL fails → +I becomes... the delete stays a delete.
        assert_eq!(ops, vec![0, 3, 3, 0]);
        assert!(
            Sql::new("s", &spec(true), "x", Some(vec!["name".into()]), None)
                .unwrap_err()
                .contains("keeps its key column id")
        );
    }
}
