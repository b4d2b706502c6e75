//! `union`: the rows of several streams as one stream — Flink's `union`, by column name.
//!
//! The output has every column of every input, in the order first seen (a column in several
//! inputs must have one type in all of them), then `stream`: the name of the input each row
//! came from. A column an input lacks is null in its rows. Rows keep their partitions and
//! their order per input; what arrives first from which input depends on the routing, as it
//! would in Flink, so a union feeds an exchange or an operator that keys by `stream` (ADR
//! 0010).
//!
//! Inputs must be append streams, all with an event time or none. The output is timed by the
//! first input's time column; rows of an input timed by another column carry their event time
//! there too (a deploy verdict's `decided_at` as a minute's `window_start`). The output is in
//! one partition when every input is (the generator's streams), else it is an ordinary stream
//! whose partitions are its inputs'.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray, new_null_array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::exchange::{ONE_PARTITION, final_per_minute, is_one_partition};
use floe_core::{StreamBatch, StreamSpec};

use crate::window::iceberg_schema;
use crate::{Context, OpError, OpResult, Operator};

/// The column naming each row's input stream.
pub const STREAM_COLUMN: &str = "stream";

/// The property of a union's output naming (comma-separated) its inputs whose rows are final
/// per minute ([`floe_core::exchange::FINAL_PER_MINUTE`]).
pub const FINAL_STREAMS: &str = "floe.union-final-streams";

/// The inputs of a union's output `stream` whose rows are final per minute.
pub fn final_streams(stream: &StreamSpec) -> Vec<String> {
    stream
        .properties
        .iter()
        .find(|(k, _)| k == FINAL_STREAMS)
        .map(|(_, v)| v.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

/// A `union` operator.
pub struct Union {
    id: String,
    outputs: Vec<StreamSpec>,
    schema: SchemaRef,
    /// Per input: its name and, per output column but `stream`, its column index.
    inputs: Vec<(String, Vec<Option<usize>>)>,
}

impl std::fmt::Debug for Union {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Union")
            .field("id", &self.id)
            .field("inputs", &self.inputs.len())
            .finish_non_exhaustive()
    }
}

impl Union {
    /// The union of `inputs` as stream `output`; `Err` says why they cannot be one stream.
    pub fn new(id: &str, output: &str, inputs: &[StreamSpec]) -> Result<Self, String> {
        let mut fields: Vec<Field> = Vec::new();
        let mut arrows = Vec::with_capacity(inputs.len());
        for input in inputs {
            if input.changelog {
                return Err(format!(
                    "stream {} is a changelog; a union reads append streams",
                    input.name
                ));
            }
            if input.time_column.is_some() != inputs[0].time_column.is_some() {
                return Err(format!(
                    "stream {} is timed by {:?} and {} by {:?}: a union's inputs all have an \
                     event time or none has",
                    inputs[0].name, inputs[0].time_column, input.name, input.time_column
                ));
            }
            let iceberg = input
                .schema
                .as_ref()
                .ok_or_else(|| format!("the columns of stream {} are not known yet", input.name))?;
            let arrow =
                iceberg::arrow::schema_to_arrow_schema(iceberg).map_err(|e| e.to_string())?;
            for field in arrow.fields() {
                if field.name().starts_with("__") {
                    continue;
                }
                if field.name() == STREAM_COLUMN {
                    return Err(format!(
                        "stream {} has a column {STREAM_COLUMN}, which a union adds",
                        input.name
                    ));
                }
                match fields.iter().find(|f| f.name() == field.name()) {
                    Some(seen) if !same_type(seen.data_type(), field.data_type()) => {
                        return Err(format!(
                            "column {} is {} in one input and {} in stream {}: select it as one \
                             type",
                            field.name(),
                            seen.data_type(),
                            field.data_type(),
                            input.name
                        ));
                    }
                    Some(_) => {}
                    None => fields.push(Field::new(field.name(), field.data_type().clone(), true)),
                }
            }
            arrows.push(arrow);
        }
        // The output is timed by the first input's time column; an input timed by another
        // column carries its own event time there.
        let time = inputs[0].time_column.as_deref();
        let mut inputs_map = Vec::with_capacity(inputs.len());
        for (input, arrow) in inputs.iter().zip(&arrows) {
            let own_time = input.time_column.as_deref();
            let mut columns = Vec::with_capacity(fields.len());
            for f in &fields {
                let name = f.name().as_str();
                if Some(name) == time && own_time != time {
                    if arrow.index_of(name).is_ok() {
                        return Err(format!(
                            "stream {} is timed by {:?} and has a column {name}, which the \
                             union fills with its event time: rename one",
                            input.name, own_time
                        ));
                    }
                    let own = own_time.and_then(|t| arrow.index_of(t).ok());
                    if let Some(i) = own
                        && !same_type(arrow.field(i).data_type(), f.data_type())
                    {
                        return Err(format!(
                            "stream {}'s event time {:?} is {}, and {name} is {}: select them as \
                             one type",
                            input.name,
                            own_time,
                            arrow.field(i).data_type(),
                            f.data_type()
                        ));
                    }
                    columns.push(own);
                } else {
                    columns.push(arrow.index_of(name).ok());
                }
            }
            inputs_map.push((input.name.clone(), columns));
        }
        fields.push(Field::new(STREAM_COLUMN, DataType::Utf8, false));
        let schema = Schema::new(fields);
        let mut properties = Vec::new();
        if inputs.iter().all(is_one_partition) {
            properties.push((ONE_PARTITION.to_string(), "true".to_string()));
        }
        // Inputs final per minute get their lineage from an exchange's writing side, each a
        // source of its own there (ADR 0010).
        let finals: Vec<&str> = inputs
            .iter()
            .filter(|i| final_per_minute(i).is_some())
            .map(|i| i.name.as_str())
            .collect();
        if !finals.is_empty() {
            properties.push((FINAL_STREAMS.to_string(), finals.join(",")));
        }
        let partition = if inputs.iter().all(|i| i.partition == inputs[0].partition) {
            inputs[0].partition.clone()
        } else {
            Vec::new()
        };
        let spec = StreamSpec {
            name: output.to_string(),
            table: output.to_string(),
            schema: Some(iceberg_schema(&schema, &[])?),
            changelog: false,
            key: Vec::new(),
            time_column: inputs[0].time_column.clone(),
            partition,
            bloom_filter_columns: Vec::new(),
            plain_columns: Vec::new(),
            properties,
        };
        Ok(Self {
            id: id.to_string(),
            outputs: vec![spec],
            schema: Arc::new(schema),
            inputs: inputs_map,
        })
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.id.clone(),
            message: message.into(),
        }
    }
}

/// `data` as type `ty`, which is its own type under other field names' metadata (ids):
/// nested children are relabelled too.
fn relabel(
    data: arrow_data::ArrayData,
    ty: &DataType,
) -> Result<arrow_data::ArrayData, arrow_schema::ArrowError> {
    let children = match ty {
        DataType::List(f) | DataType::LargeList(f) | DataType::Map(f, _) => data
            .child_data()
            .iter()
            .map(|c| relabel(c.clone(), f.data_type()))
            .collect::<Result<Vec<_>, _>>()?,
        DataType::Struct(fields) => data
            .child_data()
            .iter()
            .zip(fields.iter())
            .map(|(c, f)| relabel(c.clone(), f.data_type()))
            .collect::<Result<Vec<_>, _>>()?,
        _ => data.child_data().to_vec(),
    };
    data.into_builder()
        .data_type(ty.clone())
        .child_data(children)
        .build()
}

/// Whether two column types are one (field ids and nullability aside).
fn same_type(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::List(x), DataType::List(y)) => same_type(x.data_type(), y.data_type()),
        (DataType::Map(x, _), DataType::Map(y, _)) => same_type(x.data_type(), y.data_type()),
        (DataType::Struct(x), DataType::Struct(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|(p, q)| p.name() == q.name() && same_type(p.data_type(), q.data_type()))
        }
        _ => a == b,
    }
}

impl Operator for Union {
    fn id(&self) -> &str {
        &self.id
    }

    fn outputs(&self) -> &[StreamSpec] {
        &self.outputs
    }

    fn on_batch(&mut self, input: &StreamBatch, ctx: &mut Context<'_>) -> OpResult<()> {
        self.on_batch_of(0, input, ctx)
    }

    fn on_batch_of(
        &mut self,
        index: usize,
        input: &StreamBatch,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        let Some((name, columns)) = self.inputs.get(index) else {
            return Err(self.invalid(format!("no input {index}")));
        };
        let rows = input.batch.num_rows();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (field, column) in self.schema.fields().iter().zip(columns) {
            arrays.push(match column {
                Some(c) if *c < input.batch.num_columns() => {
                    let array = input.batch.column(*c).clone();
                    if array.data_type() == field.data_type() {
                        array
                    } else {
                        // The same type under other field ids: take the output's.
                        let data = relabel(array.to_data(), field.data_type())
                            .map_err(|e| self.invalid(e.to_string()))?;
                        arrow_array::make_array(data)
                    }
                }
                _ => new_null_array(field.data_type(), rows),
            });
        }
        arrays.push(Arc::new(StringArray::from(vec![name.as_str(); rows])));
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| self.invalid(format!("union rows: {e}")))?;
        ctx.emit(
            0,
            StreamBatch {
                stream: 0,
                batch,
                runs: input.runs.clone(),
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Int64Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    fn stream(name: &str, columns: &[(&str, PrimitiveType)]) -> StreamSpec {
        let fields: Vec<_> = columns
            .iter()
            .enumerate()
            .map(|(i, (n, t))| {
                Arc::new(NestedField::optional(
                    i as i32 + 1,
                    *n,
                    Type::Primitive(t.clone()),
                ))
            })
            .collect();
        let schema = iceberg::spec::Schema::builder()
            .with_fields(fields)
            .build()
            .unwrap();
        StreamSpec {
            time_column: Some("ts".into()),
            ..StreamSpec::append(name, name, schema)
        }
    }

    #[test]
    fn rows_of_each_input_keep_their_columns_and_name_their_stream() {
        let a = stream(
            "a",
            &[("ts", PrimitiveType::Long), ("x", PrimitiveType::Long)],
        );
        let b = stream(
            "b",
            &[("y", PrimitiveType::String), ("ts", PrimitiveType::Long)],
        );
        let mut union = Union::new("u", "both", &[a, b]).unwrap();
        let names: Vec<String> = union
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["ts", "x", "y", STREAM_COLUMN]);
        let from_b = RecordBatch::try_from_iter([
            ("y", Arc::new(StringArray::from(vec!["p", "q"])) as ArrayRef),
            ("ts", Arc::new(Int64Array::from(vec![5, 6])) as ArrayRef),
        ])
        .unwrap();
        let partitions = |p: u32| format!("t/{p}");
        let mut ctx = Context::new(None, 0, &partitions);
        let mut batch = StreamBatch::single(3, from_b, 7);
        batch.runs = vec![
            floe_core::PartitionRun {
                partition: 7,
                rows: 1,
            },
            floe_core::PartitionRun {
                partition: 8,
                rows: 1,
            },
        ];
        union.on_batch_of(1, &batch, &mut ctx).unwrap();
        let (emitted, _) = ctx.finish();
        let out = &emitted[0].1;
        assert_eq!(out.runs, batch.runs);
        let b = &out.batch;
        assert_eq!(b.column(0).as_primitive::<Int64Type>().values(), &[5, 6]);
        assert_eq!(b.column(1).null_count(), 2);
        assert_eq!(b.column(2).as_string::<i32>().value(1), "q");
        assert_eq!(b.column(3).as_string::<i32>().value(0), "b");
    }

    #[test]
    fn an_input_timed_by_another_column_carries_its_time_in_the_first_inputs() {
        let a = stream("a", &[("ts", PrimitiveType::Long)]);
        let c = StreamSpec {
            time_column: Some("at".into()),
            ..stream(
                "c",
                &[("at", PrimitiveType::Long), ("v", PrimitiveType::Long)],
            )
        };
        let mut union = Union::new("u", "both", &[a, c]).unwrap();
        assert_eq!(union.outputs()[0].time_column.as_deref(), Some("ts"));
        let rows = RecordBatch::try_from_iter([
            ("at", Arc::new(Int64Array::from(vec![9])) as ArrayRef),
            ("v", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        ])
        .unwrap();
        let partitions = |p: u32| format!("t/{p}");
        let mut ctx = Context::new(None, 0, &partitions);
        union
            .on_batch_of(1, &StreamBatch::single(0, rows, 0), &mut ctx)
            .unwrap();
        let (emitted, _) = ctx.finish();
        let b = &emitted[0].1.batch;
        let column = |n: &str| {
            b.column_by_name(n)
                .unwrap()
                .as_primitive::<Int64Type>()
                .value(0)
        };
        assert_eq!((column("ts"), column("at"), column("v")), (9, 9, 1));
    }

    #[test]
    fn inputs_that_cannot_be_one_stream_are_refused() {
        let a = stream(
            "a",
            &[("ts", PrimitiveType::Long), ("x", PrimitiveType::Long)],
        );
        let b = stream(
            "b",
            &[("ts", PrimitiveType::Long), ("x", PrimitiveType::String)],
        );
        let e = Union::new("u", "both", &[a.clone(), b]).unwrap_err();
        assert!(e.contains("column x is Int64 in one input and Utf8"), "{e}");
        let timed_by = |name: &str, columns: &[(&str, PrimitiveType)]| StreamSpec {
            time_column: Some("at".into()),
            ..stream(name, columns)
        };
        let c = timed_by(
            "c",
            &[("at", PrimitiveType::Long), ("ts", PrimitiveType::Long)],
        );
        let e = Union::new("u", "both", &[a.clone(), c]).unwrap_err();
        assert!(e.contains("rename one"), "{e}");
        let c = timed_by("c", &[("at", PrimitiveType::Timestamp)]);
        let e = Union::new("u", "both", &[a.clone(), c]).unwrap_err();
        assert!(e.contains("as one type"), "{e}");
        let untimed = StreamSpec {
            time_column: None,
            ..stream("u", &[("x", PrimitiveType::Long)])
        };
        let e = Union::new("u", "both", &[a.clone(), untimed]).unwrap_err();
        assert!(e.contains("or none has"), "{e}");
        let d = stream(
            "d",
            &[
                ("ts", PrimitiveType::Long),
                ("stream", PrimitiveType::String),
            ],
        );
        let e = Union::new("u", "both", &[a, d]).unwrap_err();
        assert!(e.contains("which a union adds"), "{e}");
    }
}
