//! Where data and delete files go: iceberg-rust's default data location (`write.data.path`,
//! else `<table>/data`) with the partition directories **escaped as Iceberg Java escapes
//! them** (`PartitionSpec.partitionToPath`: each field name and value form-URL-encoded, so
//! `partition=topic/0` becomes `partition=topic%2F0`).
//!
//! iceberg-rust 0.10's `DefaultLocationGenerator` writes values as they are: a value holding
//! `/` then opens a directory of its own, and a value with `=` or `%` reads back differently
//! from the path. Locations are opaque to Iceberg readers, but DuckDB's iceberg extension
//! takes hive-style partition values from the paths of delete files: with `topic/0` it read
//! `topic` and applied none of the state table's equality deletes. This could be upstreamed
//! as a change to `PartitionSpec::partition_to_path`.

use iceberg::spec::{PartitionKey, TableMetadata};
use iceberg::writer::file_writer::location_generator::{
    DefaultLocationGenerator, LocationGenerator,
};

use crate::error::LakeResult;

/// iceberg's default location, with escaped partition directories.
#[derive(Debug, Clone)]
pub struct EscapedLocationGenerator {
    inner: DefaultLocationGenerator,
}

impl EscapedLocationGenerator {
    /// The generator of `metadata`'s table.
    pub fn new(metadata: &TableMetadata) -> LakeResult<Self> {
        Ok(Self {
            inner: DefaultLocationGenerator::new(metadata)?,
        })
    }
}

/// `name=value/…` of a partition, each part escaped as Iceberg Java's `URLEncoder` does.
pub fn partition_path(key: &PartitionKey) -> String {
    let escape = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let spec = key.spec();
    let partition_type = spec
        .partition_type(key.schema())
        .expect("a partition key's spec binds to its schema");
    spec.fields()
        .iter()
        .zip(partition_type.fields())
        .enumerate()
        .map(|(i, (field, ty))| {
            let value = key.data()[i].as_ref();
            let human = field.transform.to_human_string(&ty.field_type, value);
            format!("{}={}", escape(&field.name), escape(&human))
        })
        .collect::<Vec<_>>()
        .join("/")
}

impl LocationGenerator for EscapedLocationGenerator {
    fn generate_location(&self, partition_key: Option<&PartitionKey>, file_name: &str) -> String {
        let plain = self.inner.generate_location(None, file_name);
        match partition_key {
            Some(key) if !PartitionKey::is_effectively_none(Some(key)) => {
                let data = plain
                    .strip_suffix(file_name)
                    .expect("the default location ends with the file name");
                format!("{data}{}/{file_name}", partition_path(key))
            }
            _ => plain,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::spec::{
        Literal, NestedField, PartitionSpec, PrimitiveType, Schema, Struct, Transform, Type,
    };

    use super::*;

    #[test]
    fn partition_values_are_escaped_as_iceberg_java_escapes_them() {
        let schema = Arc::new(
            Schema::builder()
                .with_fields(vec![
                    Arc::new(NestedField::required(
                        1,
                        "partition",
                        Type::Primitive(PrimitiveType::String),
                    )),
                    Arc::new(NestedField::required(
                        2,
                        "day",
                        Type::Primitive(PrimitiveType::Int),
                    )),
                ])
                .build()
                .unwrap(),
        );
        let spec = PartitionSpec::builder(schema.clone())
            .add_partition_field("partition", "partition", Transform::Identity)
            .unwrap()
            .add_partition_field("day", "day bucket", Transform::Bucket(4))
            .unwrap()
            .build()
            .unwrap();
        let key = |v: &str| {
            PartitionKey::new(
                spec.clone(),
                schema.clone(),
                Struct::from_iter([Some(Literal::string(v)), Some(Literal::int(3))]),
            )
        };
        // Iceberg Java: URLEncoder.encode("topic/0", UTF_8) = "topic%2F0"; a space is '+'.
        assert_eq!(
            partition_path(&key("topic/0")),
            "partition=topic%2F0/day+bucket=3"
        );
        assert_eq!(
            partition_path(&key("a=b %")),
            "partition=a%3Db+%25/day+bucket=3"
        );
        assert_eq!(
            partition_path(&key("plain-value_1.x")),
            "partition=plain-value_1.x/day+bucket=3"
        );
    }
}
