//! A Debezium topic's columns: the JsonConverter envelope split from its payload, the row
//! schema (Connect types and Debezium logical types) mapped to columns and their value
//! encodings, or — without a schema — columns inferred from the first values.
//!
//! Errors are a `String` naming the field or type: the caller adds the topic and the fault
//! (a table whose columns cannot be mapped stops the job: the user's).

use serde_json::Value as Json;

use super::values::Encoding;
use crate::changelog::Column;
use crate::types::{PgType, Scalar};

/// A column of a Debezium table and how its JSON values are read.
#[derive(Debug, Clone)]
pub(super) struct DbzColumn {
    pub(super) column: Column,
    pub(super) encoding: Encoding,
}

/// Splits a JsonConverter message into (schema, payload); without the envelope the schema is
/// `None`.
pub(super) fn envelope(json: Json) -> (Option<Json>, Json) {
    match json {
        Json::Object(mut map) if map.contains_key("payload") && map.contains_key("schema") => {
            let payload = map.remove("payload").unwrap_or(Json::Null);
            (map.remove("schema"), payload)
        }
        other => (None, other),
    }
}

/// The columns of a topic's table, from its first event: the row schema of the envelope (its
/// `after`/`before` field), else the values of the row image, else (a delete or tombstone
/// first) the record key's schema or values. The key columns are the fields of the key.
pub(super) fn first_columns(
    topic: &str,
    key: &Json,
    key_schema: Option<&Json>,
    schema: Option<&Json>,
    payload: &Json,
) -> Result<Vec<DbzColumn>, String> {
    let key_fields: Vec<String> = match key {
        Json::Object(map) => map.keys().cloned().collect(),
        _ => {
            return Err(format!(
                "topic {topic}: records have no key (a table without a primary key); \
                 Floe keeps tables by key"
            ));
        }
    };
    let row_schema = schema.and_then(|s| {
        s.get("fields")?
            .as_array()?
            .iter()
            .find(|f| {
                f.get("field").and_then(Json::as_str) == Some("after")
                    || f.get("field").and_then(Json::as_str) == Some("before")
            })
            .cloned()
    });
    let image = payload
        .get("after")
        .filter(|v| !v.is_null())
        .or_else(|| payload.get("before").filter(|v| !v.is_null()));
    let mut columns: Vec<DbzColumn> = match (&row_schema, image) {
        (Some(row), _) => row
            .get("fields")
            .and_then(Json::as_array)
            .ok_or_else(|| format!("topic {topic}: the row schema has no fields"))?
            .iter()
            .map(|f| {
                let name = f.get("field").and_then(Json::as_str).unwrap_or_default();
                column_from_schema(f, key_fields.iter().any(|k| k == name))
            })
            .collect::<Result<_, _>>()
            .map_err(|e| format!("topic {topic}: {e}"))?,
        (None, Some(Json::Object(row))) => row
            .iter()
            .map(|(k, v)| infer(k, v, key_fields.contains(k)))
            .collect(),
        (None, _) => {
            // A delete or tombstone first: the key is all we know.
            let key_schema_fields = key_schema
                .and_then(|s| s.get("fields"))
                .and_then(Json::as_array);
            match (key_schema_fields, key) {
                (Some(fields), _) => fields
                    .iter()
                    .map(|f| column_from_schema(f, true))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("topic {topic}: {e}"))?,
                (None, Json::Object(map)) => map.iter().map(|(k, v)| infer(k, v, true)).collect(),
                _ => Vec::new(),
            }
        }
    };
    for c in &mut columns {
        c.column.key = key_fields.contains(&c.column.name);
    }
    if let Some(missing) = key_fields
        .iter()
        .find(|k| !columns.iter().any(|c| &c.column.name == *k))
    {
        return Err(format!(
            "topic {topic}: key field {missing} is not a column of the rows"
        ));
    }
    Ok(columns)
}

/// The columns a later event's row schema (or, without one, its non-null values) has that
/// `known` does not.
pub(super) fn added_columns(
    known: &[DbzColumn],
    schema: Option<&Json>,
    image: &Json,
) -> Result<Vec<DbzColumn>, String> {
    let mut added = Vec::new();
    if let Some(fields) = schema
        .and_then(|s| s.get("fields"))
        .and_then(Json::as_array)
        .and_then(|fields| {
            fields
                .iter()
                .find(|f| f.get("field").and_then(Json::as_str) == Some("after"))
        })
        .and_then(|row| row.get("fields"))
        .and_then(Json::as_array)
    {
        for f in fields {
            let name = f.get("field").and_then(Json::as_str).unwrap_or_default();
            if !known.iter().any(|c| c.column.name == name) {
                added.push(column_from_schema(f, false)?);
            }
        }
    } else if let Json::Object(row) = image {
        for (k, v) in row {
            if !v.is_null() && !known.iter().any(|c| &c.column.name == k) {
                added.push(infer(k, v, false));
            }
        }
    }
    Ok(added)
}

fn column_from_schema(field: &Json, key: bool) -> Result<DbzColumn, String> {
    let name = field
        .get("field")
        .and_then(Json::as_str)
        .ok_or("a schema field without a name")?
        .to_string();
    let ty = field.get("type").and_then(Json::as_str).unwrap_or("string");
    let logical = field.get("name").and_then(Json::as_str).unwrap_or("");
    let param = |k: &str| {
        field
            .get("parameters")
            .and_then(|p| p.get(k))
            .and_then(Json::as_str)
            .and_then(|v| v.parse::<i64>().ok())
    };
    let (scalar, encoding) = scalar_of(ty, logical, &param)
        .ok_or_else(|| format!("column {name}: type {ty} {logical} is not supported"))?;
    let (scalar, array) = if ty == "array" {
        let items = field
            .get("items")
            .ok_or_else(|| format!("column {name}: array without items"))?;
        let ity = items.get("type").and_then(Json::as_str).unwrap_or("string");
        let ilogical = items.get("name").and_then(Json::as_str).unwrap_or("");
        let iparam = |k: &str| {
            items
                .get("parameters")
                .and_then(|p| p.get(k))
                .and_then(Json::as_str)
                .and_then(|v| v.parse::<i64>().ok())
        };
        let (s, e) = scalar_of(ity, ilogical, &iparam)
            .ok_or_else(|| format!("column {name}: array of {ity} is not supported"))?;
        return Ok(DbzColumn {
            column: Column {
                name,
                ty: PgType {
                    scalar: s,
                    array: true,
                },
                key,
            },
            encoding: e,
        });
    } else {
        (scalar, false)
    };
    Ok(DbzColumn {
        column: Column {
            name,
            ty: PgType { scalar, array },
            key,
        },
        encoding,
    })
}

fn scalar_of(
    ty: &str,
    logical: &str,
    param: &dyn Fn(&str) -> Option<i64>,
) -> Option<(Scalar, Encoding)> {
    Some(match (ty, logical) {
        (_, "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date") => {
            (Scalar::Date, Encoding::EpochDays)
        }
        (_, "io.debezium.time.Time" | "org.apache.kafka.connect.data.Time") => {
            (Scalar::Time, Encoding::TimeOfDay(1_000))
        }
        (_, "io.debezium.time.MicroTime") => (Scalar::Time, Encoding::TimeOfDay(1_000_000)),
        (_, "io.debezium.time.NanoTime") => (Scalar::Time, Encoding::TimeOfDay(1_000_000_000)),
        (_, "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp") => {
            (Scalar::Timestamp, Encoding::Epoch(1_000))
        }
        (_, "io.debezium.time.MicroTimestamp") => (Scalar::Timestamp, Encoding::Epoch(1_000_000)),
        (_, "io.debezium.time.NanoTimestamp") => {
            (Scalar::Timestamp, Encoding::Epoch(1_000_000_000))
        }
        (_, "io.debezium.time.ZonedTimestamp") => (Scalar::Timestamptz, Encoding::Zoned),
        (_, "io.debezium.data.Uuid") => (Scalar::Uuid, Encoding::Plain),
        ("bytes", "org.apache.kafka.connect.data.Decimal") => {
            let scale = param("scale").unwrap_or(0);
            let precision = param("connect.decimal.precision").unwrap_or(38);
            if !(0..=38).contains(&precision) || scale < 0 || scale > precision {
                return None;
            }
            (
                Scalar::Decimal {
                    precision: precision as u8,
                    scale: scale as i8,
                },
                Encoding::ConnectDecimal(scale as i8),
            )
        }
        ("struct", "io.debezium.data.VariableScaleDecimal") => {
            (Scalar::Text, Encoding::VariableDecimal)
        }
        ("int8" | "int16" | "int32", _) => (Scalar::Int, Encoding::Plain),
        ("int64", _) => (Scalar::Long, Encoding::Plain),
        ("float32", _) => (Scalar::Float, Encoding::Plain),
        ("float64", _) => (Scalar::Double, Encoding::Plain),
        ("boolean", _) => (Scalar::Bool, Encoding::Plain),
        ("string", _) => (Scalar::Text, Encoding::Plain),
        ("bytes", _) => (Scalar::Bytes, Encoding::Base64),
        ("array", _) => (Scalar::Text, Encoding::Plain),
        ("struct" | "map", _) => (Scalar::Text, Encoding::Plain),
        _ => return None,
    })
}

fn infer(name: &str, value: &Json, key: bool) -> DbzColumn {
    let scalar_of_value = |v: &Json| match v {
        Json::Bool(_) => Scalar::Bool,
        Json::Number(n) if n.is_i64() || n.is_u64() => Scalar::Long,
        Json::Number(_) => Scalar::Double,
        _ => Scalar::Text,
    };
    let ty = match value {
        Json::Array(items) => PgType {
            scalar: items
                .iter()
                .find(|v| !v.is_null())
                .map_or(Scalar::Text, scalar_of_value),
            array: true,
        },
        v => PgType {
            scalar: scalar_of_value(v),
            array: false,
        },
    };
    DbzColumn {
        column: Column {
            name: name.to_string(),
            ty,
            key,
        },
        encoding: Encoding::Plain,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn columns_come_from_the_row_schema_or_the_values() {
        let (schema, payload) = envelope(json!({
            "schema": {"fields": [{"field": "after", "fields": [
                {"field": "id", "type": "int64"},
                {"field": "balance", "type": "bytes",
                 "name": "org.apache.kafka.connect.data.Decimal",
                 "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
            ]}]},
            "payload": {"op": "c", "after": {"id": 1, "balance": "BOI="}},
        }));
        let key = json!({"id": 1});
        let columns = first_columns("p.public.t", &key, None, schema.as_ref(), &payload).unwrap();
        assert_eq!(columns.len(), 2);
        assert!(columns[0].column.key && !columns[1].column.key);
        assert_eq!(
            columns[1].column.ty.scalar,
            Scalar::Decimal {
                precision: 10,
                scale: 2
            }
        );
        assert_eq!(columns[1].encoding, Encoding::ConnectDecimal(2));

        // Without the envelope: inferred from the values.
        let (schema, payload) = envelope(json!({"op": "c", "after": {"id": 1, "tags": ["a"]}}));
        assert!(schema.is_none());
        let columns = first_columns("p.public.t", &key, None, None, &payload).unwrap();
        let tags = columns.iter().find(|c| c.column.name == "tags").unwrap();
        assert!(tags.column.ty.array && tags.column.ty.scalar == Scalar::Text);

        let err = first_columns("p.public.t", &Json::Null, None, None, &payload).unwrap_err();
        assert!(err.contains("records have no key"), "{err}");
    }
}
