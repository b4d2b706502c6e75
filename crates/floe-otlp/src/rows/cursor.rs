//! The row cursor: a table's Arrow builders, made from its schema, filled one value per
//! column in schema order (nested structs, lists and maps through the same cursor), with
//! the builder type of each column checked as it is written.

use super::*;

pub(super) type AnyBuilder = Box<dyn ArrayBuilder>;

/// Rows the builders have room for before they grow (the job hands over every 64k rows).
pub(super) const INITIAL_ROWS: usize = 16 * 1024;
pub(super) type StrMapBuilder = MapBuilder<AnyBuilder, AnyBuilder>;
pub(super) type AnyListBuilder = ListBuilder<AnyBuilder>;

/// Builders for one table.
pub(super) struct TableColumns {
    schema: SchemaRef,
    columns: Vec<AnyBuilder>,
    pub(super) rows: usize,
}

impl TableColumns {
    pub(super) fn new(schema: SchemaRef) -> Self {
        let columns = schema
            .fields()
            .iter()
            .map(|f| make_builder(f.data_type(), INITIAL_ROWS))
            .collect();
        Self {
            schema,
            columns,
            rows: 0,
        }
    }

    pub(super) fn row(&mut self) -> Row<'_, Vec<AnyBuilder>> {
        self.rows += 1;
        Row {
            slots: &mut self.columns,
            next: 0,
        }
    }

    pub(super) fn finish(&mut self) -> RecordBatch {
        let arrays: Vec<ArrayRef> = self.columns.iter_mut().map(|c| c.finish()).collect();
        self.rows = 0;
        RecordBatch::try_new(self.schema.clone(), arrays)
            .expect("rows are appended in schema order, one value per column")
    }
}

/// Builders addressed by position: a table's columns or a struct's fields.
pub(super) trait Slots {
    fn slot<B: ArrayBuilder>(&mut self, index: usize) -> &mut B;
}

impl Slots for Vec<AnyBuilder> {
    fn slot<B: ArrayBuilder>(&mut self, index: usize) -> &mut B {
        self[index]
            .as_any_mut()
            .downcast_mut::<B>()
            .unwrap_or_else(|| panic!("column {index} has another builder type"))
    }
}

impl Slots for StructBuilder {
    fn slot<B: ArrayBuilder>(&mut self, index: usize) -> &mut B {
        self.field_builder::<B>(index)
            .unwrap_or_else(|| panic!("struct field {index} has another builder type"))
    }
}

/// Appends one value to each column in order.
pub(super) struct Row<'a, S: Slots> {
    slots: &'a mut S,
    next: usize,
}

pub(super) fn downcast<B: ArrayBuilder>(builder: &mut AnyBuilder) -> &mut B {
    builder
        .as_any_mut()
        .downcast_mut::<B>()
        .expect("nested builder of the schema's type")
}

impl<S: Slots> Row<'_, S> {
    pub(super) fn builder<B: ArrayBuilder>(&mut self) -> &mut B {
        let index = self.next;
        self.next += 1;
        self.slots.slot::<B>(index)
    }

    pub(super) fn str(&mut self, value: Option<&str>) {
        self.builder::<StringBuilder>().append_option(value);
    }

    /// A string column where the empty string means "not set".
    pub(super) fn text(&mut self, value: &str) {
        self.str((!value.is_empty()).then_some(value));
    }

    pub(super) fn long(&mut self, value: Option<i64>) {
        self.builder::<Int64Builder>().append_option(value);
    }

    pub(super) fn int(&mut self, value: Option<i32>) {
        self.builder::<Int32Builder>().append_option(value);
    }

    pub(super) fn uint(&mut self, value: u32) {
        // Iceberg has no unsigned types: counts and flags are bit-cast.
        self.int(Some(value as i32));
    }

    pub(super) fn double(&mut self, value: Option<f64>) {
        self.builder::<Float64Builder>().append_option(value);
    }

    pub(super) fn bool(&mut self, value: Option<bool>) {
        self.builder::<BooleanBuilder>().append_option(value);
    }

    pub(super) fn ts(&mut self, unix_nano: Option<u64>) {
        self.builder::<TimestampMicrosecondBuilder>()
            .append_option(unix_nano.map(nanos_to_micros));
    }

    pub(super) fn nanos(&mut self, unix_nano: u64) {
        self.long(Some(unix_nano as i64));
    }

    /// A `*_unix_nano` column where 0 means "not set".
    pub(super) fn nanos_opt(&mut self, unix_nano: u64) {
        self.long((unix_nano != 0).then_some(unix_nano as i64));
    }

    pub(super) fn id(&mut self, bytes: &[u8]) {
        let mut buffer = [0u8; 64];
        let hex = hex_into(bytes, &mut buffer);
        self.str(hex);
    }

    pub(super) fn attributes(&mut self, attributes: &[KeyValue]) {
        let map = self.builder::<StrMapBuilder>();
        let mut text = String::new();
        for kv in attributes {
            downcast::<StringBuilder>(map.keys()).append_value(&kv.key);
            let values = downcast::<StringBuilder>(map.values());
            match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                // The common case, without a copy.
                Some(any_value::Value::StringValue(s)) => values.append_value(s),
                Some(_) => {
                    text.clear();
                    write_any(kv.value.as_ref().expect("matched"), &mut text);
                    values.append_value(&text);
                }
                None => values.append_null(),
            }
        }
        map.append(true).expect("keys and values appended in pairs");
    }

    pub(super) fn longs(&mut self, values: &[u64]) {
        let list = self.builder::<AnyListBuilder>();
        let items = downcast::<Int64Builder>(list.values());
        for v in values {
            items.append_value(*v as i64);
        }
        list.append(true);
    }

    pub(super) fn signed_longs(&mut self, values: impl IntoIterator<Item = i64>) {
        let list = self.builder::<AnyListBuilder>();
        let items = downcast::<Int64Builder>(list.values());
        for v in values {
            items.append_value(v);
        }
        list.append(true);
    }

    /// A `list<string>` column; the empty string is kept as given.
    pub(super) fn strs<'s>(&mut self, values: impl IntoIterator<Item = &'s str>) {
        let list = self.builder::<AnyListBuilder>();
        let items = downcast::<StringBuilder>(list.values());
        for v in values {
            items.append_value(v);
        }
        list.append(true);
    }

    pub(super) fn doubles(&mut self, values: &[f64]) {
        let list = self.builder::<AnyListBuilder>();
        let items = downcast::<Float64Builder>(list.values());
        for v in values {
            items.append_value(*v);
        }
        list.append(true);
    }

    /// A `list<struct>` column: `fill` appends each element's fields through a nested row.
    pub(super) fn structs<I>(
        &mut self,
        items: impl IntoIterator<Item = I>,
        fill: impl Fn(&mut Row<'_, StructBuilder>, I),
    ) {
        let list = self.builder::<AnyListBuilder>();
        let elements = downcast::<StructBuilder>(list.values());
        for item in items {
            let mut row = Row {
                slots: &mut *elements,
                next: 0,
            };
            fill(&mut row, item);
            elements.append(true);
        }
        list.append(true);
    }
}

/// A numeric value that is either a double or an exact integer: written as `value` (double)
/// and `value_int` (exact, only for integers).
#[derive(Clone, Copy)]
pub(super) enum Number {
    Double(f64),
    Int(i64),
}

impl<S: Slots> Row<'_, S> {
    pub(super) fn number(&mut self, value: Option<Number>) {
        let (double, int) = match value {
            Some(Number::Double(d)) => (Some(d), None),
            Some(Number::Int(i)) => (Some(i as f64), Some(i)),
            None => (None, None),
        };
        self.double(double);
        self.long(int);
    }
}
