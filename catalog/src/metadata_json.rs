//! Table metadata as the catalog writes and serves it: JSON whose lists are in the order
//! Iceberg Java writes them.
//!
//! iceberg-rust keeps snapshots, schemas, partition specs and sort orders in maps, so its own
//! serialization lists them in hash order; a reader or a script that takes the last entry of
//! `snapshots` as the newest gets another one. Every metadata file and every response body
//! that carries metadata goes through [`order`]: `snapshots` by sequence number (commit
//! order; then timestamp and id, for v1 tables without sequence numbers), `schemas`,
//! `partition-specs` and `sort-orders` by id. The content is unchanged.

use iceberg::spec::TableMetadata;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};

/// `metadata` as ordered JSON.
pub fn to_value(metadata: &TableMetadata) -> ApiResult<Value> {
    let mut value = serde_json::to_value(metadata)
        .map_err(|e| ApiError::internal(format!("could not encode table metadata: {e}")))?;
    order(&mut value);
    Ok(value)
}

/// Puts the lists of a table metadata JSON object in commit and id order.
pub fn order(metadata: &mut Value) {
    let number = |entry: &Value, key: &str| entry.get(key).and_then(Value::as_i64).unwrap_or(0);
    if let Some(snapshots) = metadata.get_mut("snapshots").and_then(Value::as_array_mut) {
        snapshots.sort_by_key(|s| {
            (
                number(s, "sequence-number"),
                number(s, "timestamp-ms"),
                number(s, "snapshot-id"),
            )
        });
    }
    for (list, id) in [
        ("schemas", "schema-id"),
        ("partition-specs", "spec-id"),
        ("sort-orders", "order-id"),
    ] {
        if let Some(entries) = metadata.get_mut(list).and_then(Value::as_array_mut) {
            entries.sort_by_key(|e| number(e, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_come_out_in_commit_and_id_order() {
        let mut metadata = serde_json::json!({
            "snapshots": [
                {"snapshot-id": 7, "sequence-number": 3, "timestamp-ms": 30},
                {"snapshot-id": 9, "sequence-number": 1, "timestamp-ms": 10},
                {"snapshot-id": 4, "sequence-number": 2, "timestamp-ms": 20},
            ],
            "schemas": [{"schema-id": 1}, {"schema-id": 0}],
            "partition-specs": [{"spec-id": 2}, {"spec-id": 0}, {"spec-id": 1}],
            "sort-orders": [{"order-id": 1}, {"order-id": 0}],
            "refs": {"main": {"snapshot-id": 7}},
        });
        order(&mut metadata);
        let ids: Vec<i64> = metadata["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["snapshot-id"].as_i64().unwrap())
            .collect();
        assert_eq!(ids, [9, 4, 7]);
        assert_eq!(metadata["schemas"][0]["schema-id"], 0);
        assert_eq!(metadata["partition-specs"][2]["spec-id"], 2);
        assert_eq!(metadata["sort-orders"][0]["order-id"], 0);
        assert_eq!(metadata["refs"]["main"]["snapshot-id"], 7);
    }
}
