//! The shared stored layout of both sketches: `List<Struct<key: Int32, value: T>>`.
//!
//! The list's item field is named `element` and is non-nullable, as Iceberg names list
//! elements; the struct's two fields are non-nullable. A list entry may be null (no sketch).

use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, ListArray, PrimitiveArray, StructArray};
use arrow_buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Fields};

use crate::SketchError;

/// The name of the list item field (Iceberg's name for list elements).
pub(crate) const ELEMENT: &str = "element";

/// The struct fields `key_name: Int32, value_name: T`, both non-nullable.
pub(crate) fn pair_fields<T: ArrowPrimitiveType>(key_name: &str, value_name: &str) -> Fields {
    Fields::from(vec![
        Field::new(key_name, DataType::Int32, false),
        Field::new(value_name, T::DATA_TYPE, false),
    ])
}

/// `List<element: Struct<key_name: Int32, value_name: T>>`.
pub(crate) fn pair_list_type<T: ArrowPrimitiveType>(key_name: &str, value_name: &str) -> DataType {
    DataType::List(Arc::new(Field::new(
        ELEMENT,
        DataType::Struct(pair_fields::<T>(key_name, value_name)),
        false,
    )))
}

/// Whether `ty` has the stored layout `List<Struct<key_name: Int32, value_name: T>>`,
/// whatever the list item's name, nullability and metadata (a round trip through Iceberg or
/// Arrow IPC may change those).
pub(crate) fn is_pair_list<T: ArrowPrimitiveType>(
    ty: &DataType,
    key_name: &str,
    value_name: &str,
) -> bool {
    let DataType::List(item) = ty else {
        return false;
    };
    let DataType::Struct(fields) = item.data_type() else {
        return false;
    };
    fields.len() == 2
        && fields[0].name() == key_name
        && fields[0].data_type() == &DataType::Int32
        && fields[1].name() == value_name
        && fields[1].data_type() == &T::DATA_TYPE
}

/// Accumulates rows of (key, value) pairs and builds the list array.
pub(crate) struct PairListBuilder<T: ArrowPrimitiveType> {
    fields: Fields,
    keys: Vec<i32>,
    values: Vec<T::Native>,
    offsets: Vec<i32>,
    validity: Vec<bool>,
    overflow: bool,
}

impl<T: ArrowPrimitiveType> PairListBuilder<T> {
    pub(crate) fn new(key_name: &str, value_name: &str) -> Self {
        Self {
            fields: pair_fields::<T>(key_name, value_name),
            keys: Vec::new(),
            values: Vec::new(),
            offsets: vec![0],
            validity: Vec::new(),
            overflow: false,
        }
    }

    fn close_row(&mut self, valid: bool) {
        match i32::try_from(self.keys.len()) {
            Ok(end) => self.offsets.push(end),
            Err(_) => {
                self.overflow = true;
                self.offsets.push(i32::MAX);
            }
        }
        self.validity.push(valid);
    }

    pub(crate) fn append_null(&mut self) {
        self.close_row(false);
    }

    pub(crate) fn append(&mut self, pairs: impl Iterator<Item = (i32, T::Native)>) {
        for (k, v) in pairs {
            self.keys.push(k);
            self.values.push(v);
        }
        self.close_row(true);
    }

    pub(crate) fn finish(self) -> Result<ListArray, SketchError> {
        if self.overflow {
            return Err(SketchError::InvalidData(
                "more than i32::MAX sketch cells in one list array; build smaller batches".into(),
            ));
        }
        let keys: ArrayRef = Arc::new(PrimitiveArray::<Int32Type>::from(self.keys));
        let values: ArrayRef = Arc::new(PrimitiveArray::<T>::new(
            ScalarBuffer::from(self.values),
            None,
        ));
        let item_type = DataType::Struct(self.fields.clone());
        let entries = StructArray::try_new(self.fields, vec![keys, values], None)
            .map_err(|e| SketchError::InvalidData(e.to_string()))?;
        let nulls = if self.validity.iter().all(|v| *v) {
            None
        } else {
            Some(NullBuffer::from(self.validity))
        };
        ListArray::try_new(
            Arc::new(Field::new(ELEMENT, item_type, false)),
            OffsetBuffer::new(ScalarBuffer::from(self.offsets)),
            Arc::new(entries),
            nulls,
        )
        .map_err(|e| SketchError::InvalidData(e.to_string()))
    }
}

/// The key and value columns of one stored sketch.
pub(crate) type PairColumns<T> = (PrimitiveArray<Int32Type>, PrimitiveArray<T>);

/// The (key, value) columns of one row of a sketch list array, or `None` for a null row.
///
/// Checks that the item type is `Struct<key_name: Int32, value_name: T>` and that the row
/// holds no null struct or field.
pub(crate) fn read_pairs<T: ArrowPrimitiveType>(
    array: &ListArray,
    row: usize,
    key_name: &str,
    value_name: &str,
) -> Result<Option<PairColumns<T>>, SketchError> {
    if row >= array.len() {
        return Err(SketchError::RowOutOfBounds {
            row,
            len: array.len(),
        });
    }
    let DataType::Struct(fields) = array.value_type() else {
        return Err(SketchError::InvalidSchema(format!(
            "expected a list of struct, found {}",
            array.data_type()
        )));
    };
    let shape_ok = fields.len() == 2
        && fields[0].name() == key_name
        && fields[0].data_type() == &DataType::Int32
        && fields[1].name() == value_name
        && fields[1].data_type() == &T::DATA_TYPE;
    if !shape_ok {
        return Err(SketchError::InvalidSchema(format!(
            "expected list<struct<{key_name}: Int32, {value_name}: {}>>, found {}",
            T::DATA_TYPE,
            array.data_type()
        )));
    }
    if array.is_null(row) {
        return Ok(None);
    }
    let entries = array.value(row);
    let Some(entries) = entries.as_any().downcast_ref::<StructArray>() else {
        return Err(SketchError::InvalidSchema(
            "list values are not a struct array".into(),
        ));
    };
    let keys = entries
        .column(0)
        .as_any()
        .downcast_ref::<PrimitiveArray<Int32Type>>()
        .cloned();
    let values = entries
        .column(1)
        .as_any()
        .downcast_ref::<PrimitiveArray<T>>()
        .cloned();
    let (Some(keys), Some(values)) = (keys, values) else {
        return Err(SketchError::InvalidSchema(
            "unexpected struct field arrays".into(),
        ));
    };
    if entries.null_count() > 0 || keys.null_count() > 0 || values.null_count() > 0 {
        return Err(SketchError::InvalidData(format!(
            "null {key_name}/{value_name} cell in sketch row {row}"
        )));
    }
    Ok(Some((keys, values)))
}
