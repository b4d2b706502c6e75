//! OTLP profiles: the one protocol version Floe reads, what makes a record of it whole, its
//! OTLP JSON form, and the dictionary lookups rows are resolved through.
//!
//! Profiles are still "development" in OTLP, and their wire format has changed between
//! releases without a version field (fields renumbered, the dictionary moved from each
//! profile to `ProfilesData`). Floe reads `opentelemetry.proto.profiles.v1development` as of
//! OTLP [`PROTO_VERSION`] (what `opentelemetry-proto` 0.33 generates). A record of another
//! version still parses as protobuf — unknown fields are skipped — but its indices then point
//! outside the dictionary or its string table does not start with `""`; [`check`] refuses
//! such a record whole, so it goes to the dead-letter table with the reason instead of
//! landing as wrong rows.
//!
//! Index 0 of every dictionary table is the "unset" entry: a zero index is valid even into
//! an empty table, and resolves to nothing.

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesData,
    ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::Value;

/// The OTLP release whose profiles protocol Floe reads.
pub const PROTO_VERSION: &str = "v1.10.0";

/// Why `data` is not a whole profiles record of [`PROTO_VERSION`], if it is not.
pub fn check(data: &ProfilesData) -> Result<(), String> {
    let empty = ProfilesDictionary::default();
    let d = data.dictionary.as_ref().unwrap_or(&empty);
    let has_samples = data
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .flat_map(|s| &s.profiles)
        .any(|p| !p.samples.is_empty());
    if has_samples && data.dictionary.is_none() {
        return Err("profiles with samples but no dictionary".into());
    }
    if d.string_table.first().is_some_and(|s| !s.is_empty()) {
        return Err(format!(
            "the string table starts with {:?}, not \"\"",
            d.string_table[0]
        ));
    }
    let strings = d.string_table.len();
    let within = |what: &str, index: i32, len: usize| -> Result<(), String> {
        if index == 0 || (index > 0 && (index as usize) < len) {
            Ok(())
        } else {
            Err(format!(
                "{what} index {index} is outside its dictionary table of {len}"
            ))
        }
    };
    let string = |what: &str, index: i32| within(what, index, strings);
    let attributes = |what: &str, indices: &[i32]| -> Result<(), String> {
        indices
            .iter()
            .try_for_each(|&i| within(what, i, d.attribute_table.len()))
    };
    for a in &d.attribute_table {
        string("attribute key", a.key_strindex)?;
        string("attribute unit", a.unit_strindex)?;
    }
    for m in &d.mapping_table {
        string("mapping file name", m.filename_strindex)?;
        attributes("mapping attribute", &m.attribute_indices)?;
    }
    for f in &d.function_table {
        string("function name", f.name_strindex)?;
        string("function system name", f.system_name_strindex)?;
        string("function file name", f.filename_strindex)?;
    }
    for l in &d.location_table {
        within("mapping", l.mapping_index, d.mapping_table.len())?;
        for line in &l.lines {
            within("function", line.function_index, d.function_table.len())?;
        }
        attributes("location attribute", &l.attribute_indices)?;
    }
    for s in &d.stack_table {
        for &l in &s.location_indices {
            within("location", l, d.location_table.len())?;
        }
    }
    for p in data
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .flat_map(|s| &s.profiles)
    {
        for t in [&p.sample_type, &p.period_type].into_iter().flatten() {
            string("value type", t.type_strindex)?;
            string("value unit", t.unit_strindex)?;
        }
        attributes("profile attribute", &p.attribute_indices)?;
        for s in &p.samples {
            within("stack", s.stack_index, d.stack_table.len())?;
            within("link", s.link_index, d.link_table.len())?;
            attributes("sample attribute", &s.attribute_indices)?;
            if !s.values.is_empty()
                && !s.timestamps_unix_nano.is_empty()
                && s.values.len() != s.timestamps_unix_nano.len()
            {
                return Err(format!(
                    "a sample has {} values but {} timestamps",
                    s.values.len(),
                    s.timestamps_unix_nano.len()
                ));
            }
        }
    }
    Ok(())
}

/// Resolves what refers to the string table outside the dictionary's own tables: attribute
/// keys given as `key_strindex` and string values given as `string_value_strindex` — which is
/// how the Collector's pdata writes a profile record's resource and scope attributes and the
/// values of its attribute table — so the rest of Floe sees ordinary attributes.
pub fn resolve_strings(data: &mut ProfilesData) -> Result<(), String> {
    let ProfilesData {
        resource_profiles,
        dictionary,
    } = data;
    let mut empty = ProfilesDictionary::default();
    let ProfilesDictionary {
        string_table,
        attribute_table,
        ..
    } = dictionary.as_mut().unwrap_or(&mut empty);
    let strings: &[String] = string_table;
    for a in attribute_table {
        if let Some(value) = a.value.as_mut() {
            resolve_value(value, strings)?;
        }
    }
    for rp in resource_profiles {
        if let Some(r) = rp.resource.as_mut() {
            r.attributes
                .iter_mut()
                .try_for_each(|kv| resolve_key_value(kv, strings))?;
        }
        for sp in &mut rp.scope_profiles {
            if let Some(scope) = sp.scope.as_mut() {
                scope
                    .attributes
                    .iter_mut()
                    .try_for_each(|kv| resolve_key_value(kv, strings))?;
            }
        }
    }
    Ok(())
}

fn lookup(strings: &[String], index: i32) -> Result<String, String> {
    match usize::try_from(index).ok().and_then(|i| strings.get(i)) {
        Some(text) => Ok(text.clone()),
        None if index == 0 => Ok(String::new()),
        None => Err(format!(
            "string index {index} is outside its dictionary table of {}",
            strings.len()
        )),
    }
}

fn resolve_key_value(kv: &mut KeyValue, strings: &[String]) -> Result<(), String> {
    if kv.key.is_empty() && kv.key_strindex != 0 {
        kv.key = lookup(strings, kv.key_strindex)?;
        kv.key_strindex = 0;
    }
    match kv.value.as_mut() {
        Some(value) => resolve_value(value, strings),
        None => Ok(()),
    }
}

fn resolve_value(value: &mut AnyValue, strings: &[String]) -> Result<(), String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    match value.value.as_mut() {
        Some(V::StringValueStrindex(index)) => {
            value.value = Some(V::StringValue(lookup(strings, *index)?));
        }
        Some(V::ArrayValue(array)) => array
            .values
            .iter_mut()
            .try_for_each(|v| resolve_value(v, strings))?,
        Some(V::KvlistValue(list)) => list
            .values
            .iter_mut()
            .try_for_each(|kv| resolve_key_value(kv, strings))?,
        _ => {}
    }
    Ok(())
}

/// The dictionary of one checked record, resolving indices (0 and absent entries resolve to
/// nothing).
#[derive(Debug, Clone, Copy)]
pub struct Dictionary<'a>(&'a ProfilesDictionary);

/// One frame of a stack, leaf first; inlined functions of one location are frames of their
/// own, innermost first, at the location's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The function's name.
    pub function: &'a str,
    /// Its source file.
    pub file: &'a str,
    /// The line in it (0: unknown).
    pub line: i64,
    /// The binary the location is in.
    pub mapping_file: &'a str,
    /// The instruction address.
    pub address: u64,
}

impl<'a> Dictionary<'a> {
    /// The dictionary of `data` (empty when it has none).
    pub fn of(data: &'a ProfilesData) -> Self {
        static EMPTY: std::sync::OnceLock<ProfilesDictionary> = std::sync::OnceLock::new();
        Self::of_dictionary(
            data.dictionary
                .as_ref()
                .unwrap_or_else(|| EMPTY.get_or_init(ProfilesDictionary::default)),
        )
    }

    /// Lookups in `dictionary`.
    pub fn of_dictionary(dictionary: &'a ProfilesDictionary) -> Self {
        Self(dictionary)
    }

    fn entry<T>(table: &'a [T], index: i32) -> Option<&'a T> {
        usize::try_from(index).ok().and_then(|i| table.get(i))
    }

    /// A string of the string table ("" for 0 or out of range).
    pub fn string(&self, index: i32) -> &'a str {
        Self::entry(&self.0.string_table, index).map_or("", String::as_str)
    }

    /// The attributes at `indices`, with their keys resolved (units are not kept).
    pub fn attributes(&self, indices: &[i32]) -> Vec<KeyValue> {
        indices
            .iter()
            .filter(|&&i| i != 0)
            .filter_map(|&i| Self::entry(&self.0.attribute_table, i))
            .map(|a| KeyValue {
                key: self.string(a.key_strindex).to_string(),
                value: a.value.clone(),
                ..Default::default()
            })
            .collect()
    }

    /// The key of the attribute at `index`.
    pub fn attribute_key(&self, index: i32) -> &'a str {
        Self::entry(&self.0.attribute_table, index).map_or("", |a| self.string(a.key_strindex))
    }

    /// The link at `index` (none for 0).
    pub fn link(&self, index: i32) -> Option<&'a Link> {
        (index != 0)
            .then(|| Self::entry(&self.0.link_table, index))
            .flatten()
    }

    /// The frames of the stack at `index`, leaf first.
    pub fn frames(&self, index: i32) -> impl Iterator<Item = Frame<'a>> + '_ {
        let stack = (index != 0)
            .then(|| Self::entry(&self.0.stack_table, index))
            .flatten();
        let dictionary = self.0;
        stack
            .into_iter()
            .flat_map(|s| &s.location_indices)
            .filter_map(move |&l| Self::entry(&dictionary.location_table, l))
            .flat_map(move |location| {
                let mapping_file = (location.mapping_index != 0)
                    .then(|| Self::entry(&dictionary.mapping_table, location.mapping_index))
                    .flatten()
                    .map_or("", |m| self.string(m.filename_strindex));
                // A location without lines is one frame with no function.
                let lines = location
                    .lines
                    .iter()
                    .map(Some)
                    .chain(location.lines.is_empty().then_some(None));
                lines.map(move |line| {
                    let function = line
                        .filter(|l| l.function_index != 0)
                        .and_then(|l| Self::entry(&dictionary.function_table, l.function_index));
                    Frame {
                        function: function.map_or("", |f| self.string(f.name_strindex)),
                        file: function.map_or("", |f| self.string(f.filename_strindex)),
                        line: line.map_or(0, |l| l.line),
                        mapping_file,
                        address: location.address,
                    }
                })
            })
    }
}

/// The hash Floe stores as `stack_hash`: 64-bit FNV-1a over each frame's function, file and
/// line, leaf first, as 16 hex digits. It depends on the frames only (not on dictionary
/// indices or addresses), so one stack hashes the same in every record, service and
/// release.
pub fn stack_hash<'a>(frames: impl IntoIterator<Item = Frame<'a>>) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    for frame in frames {
        eat(frame.function.as_bytes());
        eat(&[0]);
        eat(frame.file.as_bytes());
        eat(&[0]);
        eat(&frame.line.to_le_bytes());
    }
    format!("{hash:016x}")
}

// --- OTLP JSON ------------------------------------------------------------------------------

/// Reads OTLP JSON (already normalised to lowerCamelCase, ids as hex) into `ProfilesData`:
/// 64-bit integers as numbers or strings, omitted fields as their defaults, `bytes` as
/// base64 (ids as hex).
pub fn from_json(value: Value) -> Result<ProfilesData, String> {
    let o = Obj::new(&value, "ProfilesData")?;
    Ok(ProfilesData {
        resource_profiles: o.list("resourceProfiles", resource_profiles)?,
        dictionary: o.opt("dictionary", dictionary)?,
    })
}

/// One JSON object being read, named for errors.
struct Obj<'a> {
    map: Option<&'a serde_json::Map<String, Value>>,
    what: &'static str,
}

impl<'a> Obj<'a> {
    fn new(value: &'a Value, what: &'static str) -> Result<Self, String> {
        match value {
            Value::Object(map) => Ok(Self {
                map: Some(map),
                what,
            }),
            Value::Null => Ok(Self { map: None, what }),
            other => Err(format!("{what} is not an object: {}", short(other))),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.and_then(|m| m.get(key)).filter(|v| !v.is_null())
    }

    fn bad(&self, key: &str, want: &str, got: &Value) -> String {
        format!("{}.{key} is not {want}: {}", self.what, short(got))
    }

    fn u64(&self, key: &str) -> Result<u64, String> {
        match self.get(key) {
            None => Ok(0),
            Some(v) => int_of(v)
                .and_then(|i| u64::try_from(i).ok())
                .ok_or_else(|| self.bad(key, "an unsigned integer", v)),
        }
    }

    fn i64(&self, key: &str) -> Result<i64, String> {
        match self.get(key) {
            None => Ok(0),
            Some(v) => int_of(v)
                .and_then(|i| i64::try_from(i).ok())
                .ok_or_else(|| self.bad(key, "an integer", v)),
        }
    }

    fn i32(&self, key: &str) -> Result<i32, String> {
        let v = self.i64(key)?;
        i32::try_from(v).map_err(|_| format!("{}.{key} is out of range: {v}", self.what))
    }

    fn u32(&self, key: &str) -> Result<u32, String> {
        let v = self.u64(key)?;
        u32::try_from(v).map_err(|_| format!("{}.{key} is out of range: {v}", self.what))
    }

    fn string(&self, key: &str) -> Result<String, String> {
        match self.get(key) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(self.bad(key, "a string", v)),
        }
    }

    /// A hex id (the normalisation turned base64 ids of the usual lengths into hex).
    fn id(&self, key: &str) -> Result<Vec<u8>, String> {
        let text = self.string(key)?;
        hex_bytes(&text).ok_or_else(|| format!("{}.{key} is not a hex id: {text:?}", self.what))
    }

    fn bytes(&self, key: &str) -> Result<Vec<u8>, String> {
        use base64::Engine as _;
        let text = self.string(key)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|_| format!("{}.{key} is not base64", self.what))
    }

    fn ints<T: TryFrom<i128>>(&self, key: &str) -> Result<Vec<T>, String> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    int_of(v)
                        .and_then(|i| T::try_from(i).ok())
                        .ok_or_else(|| self.bad(key, "a list of integers", v))
                })
                .collect(),
            Some(v) => Err(self.bad(key, "a list", v)),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, String> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(self.bad(key, "a list of strings", other)),
                })
                .collect(),
            Some(v) => Err(self.bad(key, "a list", v)),
        }
    }

    fn list<T>(
        &self,
        key: &str,
        read: impl Fn(&'a Value) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(read).collect(),
            Some(v) => Err(self.bad(key, "a list", v)),
        }
    }

    fn opt<T>(
        &self,
        key: &str,
        read: impl Fn(&'a Value) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        self.get(key).map(read).transpose()
    }
}

fn short(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > 40 {
        text.truncate(text.floor_char_boundary(40));
        text.push('…');
    }
    text
}

/// An integer given as a JSON number or a decimal string (OTLP JSON writes 64-bit integers
/// as strings).
fn int_of(value: &Value) -> Option<i128> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from)),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A key-value whose key may be a string-table index (`keyStrindex`, which pdata writes).
fn key_value(v: &Value) -> Result<KeyValue, String> {
    let o = Obj::new(v, "KeyValue")?;
    Ok(KeyValue {
        key: o.string("key")?,
        value: o.opt("value", any_value)?,
        key_strindex: o.i32("keyStrindex")?,
    })
}

/// A value, also as a string-table index (`stringValueStrindex`, which pdata writes and
/// `opentelemetry-proto`'s serde does not read) and nested in arrays and kvlists.
fn any_value(v: &Value) -> Result<AnyValue, String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};
    let o = Obj::new(v, "AnyValue")?;
    let value = if o.get("stringValueStrindex").is_some() {
        Some(V::StringValueStrindex(o.i32("stringValueStrindex")?))
    } else if let Some(array) = o.get("arrayValue") {
        let a = Obj::new(array, "ArrayValue")?;
        Some(V::ArrayValue(ArrayValue {
            values: a.list("values", any_value)?,
        }))
    } else if let Some(list) = o.get("kvlistValue") {
        let l = Obj::new(list, "KeyValueList")?;
        Some(V::KvlistValue(KeyValueList {
            values: l.list("values", key_value)?,
        }))
    } else {
        return serde_json::from_value(v.clone()).map_err(|e| format!("AnyValue: {e}"));
    };
    Ok(AnyValue { value })
}

fn resource(v: &Value) -> Result<Resource, String> {
    let o = Obj::new(v, "Resource")?;
    Ok(Resource {
        attributes: o.list("attributes", key_value)?,
        dropped_attributes_count: o.u32("droppedAttributesCount")?,
        ..Default::default()
    })
}

fn scope(v: &Value) -> Result<InstrumentationScope, String> {
    let o = Obj::new(v, "InstrumentationScope")?;
    Ok(InstrumentationScope {
        name: o.string("name")?,
        version: o.string("version")?,
        attributes: o.list("attributes", key_value)?,
        dropped_attributes_count: o.u32("droppedAttributesCount")?,
    })
}

fn resource_profiles(v: &Value) -> Result<ResourceProfiles, String> {
    let o = Obj::new(v, "ResourceProfiles")?;
    Ok(ResourceProfiles {
        resource: o.opt("resource", resource)?,
        scope_profiles: o.list("scopeProfiles", scope_profiles)?,
        schema_url: o.string("schemaUrl")?,
    })
}

fn scope_profiles(v: &Value) -> Result<ScopeProfiles, String> {
    let o = Obj::new(v, "ScopeProfiles")?;
    Ok(ScopeProfiles {
        scope: o.opt("scope", scope)?,
        profiles: o.list("profiles", profile)?,
        schema_url: o.string("schemaUrl")?,
    })
}

fn value_type(v: &Value) -> Result<ValueType, String> {
    let o = Obj::new(v, "ValueType")?;
    Ok(ValueType {
        type_strindex: o.i32("typeStrindex")?,
        unit_strindex: o.i32("unitStrindex")?,
    })
}

fn profile(v: &Value) -> Result<Profile, String> {
    let o = Obj::new(v, "Profile")?;
    Ok(Profile {
        sample_type: o.opt("sampleType", value_type)?,
        samples: o.list("samples", sample)?,
        time_unix_nano: o.u64("timeUnixNano")?,
        duration_nano: o.u64("durationNano")?,
        period_type: o.opt("periodType", value_type)?,
        period: o.i64("period")?,
        profile_id: o.id("profileId")?,
        dropped_attributes_count: o.u32("droppedAttributesCount")?,
        original_payload_format: o.string("originalPayloadFormat")?,
        original_payload: o.bytes("originalPayload")?,
        attribute_indices: o.ints("attributeIndices")?,
    })
}

fn sample(v: &Value) -> Result<Sample, String> {
    let o = Obj::new(v, "Sample")?;
    Ok(Sample {
        stack_index: o.i32("stackIndex")?,
        attribute_indices: o.ints("attributeIndices")?,
        link_index: o.i32("linkIndex")?,
        values: o.ints("values")?,
        timestamps_unix_nano: o.ints("timestampsUnixNano")?,
    })
}

fn dictionary(v: &Value) -> Result<ProfilesDictionary, String> {
    let o = Obj::new(v, "ProfilesDictionary")?;
    Ok(ProfilesDictionary {
        mapping_table: o.list("mappingTable", mapping)?,
        location_table: o.list("locationTable", location)?,
        function_table: o.list("functionTable", function)?,
        link_table: o.list("linkTable", link)?,
        string_table: o.strings("stringTable")?,
        attribute_table: o.list("attributeTable", attribute)?,
        stack_table: o.list("stackTable", stack)?,
    })
}

fn mapping(v: &Value) -> Result<Mapping, String> {
    let o = Obj::new(v, "Mapping")?;
    Ok(Mapping {
        memory_start: o.u64("memoryStart")?,
        memory_limit: o.u64("memoryLimit")?,
        file_offset: o.u64("fileOffset")?,
        filename_strindex: o.i32("filenameStrindex")?,
        attribute_indices: o.ints("attributeIndices")?,
    })
}

fn location(v: &Value) -> Result<Location, String> {
    let o = Obj::new(v, "Location")?;
    Ok(Location {
        mapping_index: o.i32("mappingIndex")?,
        address: o.u64("address")?,
        lines: o.list("lines", |v| {
            let o = Obj::new(v, "Line")?;
            Ok(Line {
                function_index: o.i32("functionIndex")?,
                line: o.i64("line")?,
                column: o.i64("column")?,
            })
        })?,
        attribute_indices: o.ints("attributeIndices")?,
    })
}

fn function(v: &Value) -> Result<Function, String> {
    let o = Obj::new(v, "Function")?;
    Ok(Function {
        name_strindex: o.i32("nameStrindex")?,
        system_name_strindex: o.i32("systemNameStrindex")?,
        filename_strindex: o.i32("filenameStrindex")?,
        start_line: o.i64("startLine")?,
    })
}

fn link(v: &Value) -> Result<Link, String> {
    let o = Obj::new(v, "Link")?;
    Ok(Link {
        trace_id: o.id("traceId")?,
        span_id: o.id("spanId")?,
    })
}

fn attribute(v: &Value) -> Result<KeyValueAndUnit, String> {
    let o = Obj::new(v, "KeyValueAndUnit")?;
    Ok(KeyValueAndUnit {
        key_strindex: o.i32("keyStrindex")?,
        value: o.opt("value", any_value)?,
        unit_strindex: o.i32("unitStrindex")?,
    })
}

fn stack(v: &Value) -> Result<Stack, String> {
    let o = Obj::new(v, "Stack")?;
    Ok(Stack {
        location_indices: o.ints("locationIndices")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Generator, profiles_json};
    use crate::{DecodeError, Decoded, Lineage, OtlpTable, Signal, TableBuilders, decode};
    use arrow_array::Array as _;
    use arrow_array::cast::AsArray;
    use prost::Message as _;

    fn generated() -> (Vec<u8>, usize) {
        let mut generator = Generator::new(3, 1_700_000_000_000_000_000);
        generator.requests(20);
        let record = generator.profiles(50);
        (record.bytes, record.items)
    }

    fn rows(bytes: &[u8]) -> arrow_array::RecordBatch {
        let decoded = decode(Signal::Profiles, bytes).unwrap();
        let mut builders = TableBuilders::new();
        let from = Lineage {
            topic: "otlp_profiles",
            partition: 0,
            offset: 1,
            ingested_at_us: 1,
        };
        builders.append(&decoded, &from);
        let mut batches = builders.finish();
        assert_eq!(batches.len(), 1);
        let (table, batch) = batches.remove(0);
        assert_eq!(table, OtlpTable::Profiles);
        batch
    }

    #[test]
    fn samples_become_rows_with_their_stacks_resolved() {
        let (bytes, items) = generated();
        let batch = rows(&bytes);
        assert_eq!(batch.num_rows(), items);
        assert_eq!(items, 5 * 50, "one profile of 50 samples per service");
        let functions = batch
            .column_by_name("function_names")
            .unwrap()
            .as_list::<i32>();
        let hashes = batch
            .column_by_name("stack_hash")
            .unwrap()
            .as_string::<i32>();
        let services = batch
            .column_by_name("service_name")
            .unwrap()
            .as_string::<i32>();
        let traces = batch.column_by_name("trace_id").unwrap().as_string::<i32>();
        let types = batch
            .column_by_name("sample_type")
            .unwrap()
            .as_string::<i32>();
        let mut by_hash = std::collections::HashMap::new();
        for row in 0..batch.num_rows() {
            let frames = functions.value(row);
            let names: Vec<String> = frames
                .as_string::<i32>()
                .iter()
                .map(|f| f.unwrap().to_string())
                .collect();
            // Leaf first, root last; the shared frames end every stack.
            assert_eq!(names.len(), 5, "{names:?}");
            assert_eq!(names[4], "main");
            assert_eq!(names[2], "net/http.(*conn).serve");
            assert!(LEAF_NAMES.contains(&names[0].as_str()), "{names:?}");
            assert_eq!(types.value(row), "cpu");
            // Equal stacks hash equal, different ones differ.
            let previous = by_hash.insert(hashes.value(row).to_string(), names.clone());
            assert!(previous.is_none_or(|p| p == names));
            assert!(!services.value(row).is_empty());
        }
        let linked = (0..batch.num_rows())
            .filter(|&r| traces.is_valid(r))
            .count();
        assert!(
            linked > items / 4 && linked < items,
            "{linked} of {items} linked to spans"
        );
        assert!(traces.iter().flatten().all(|t| t.len() == 32));
    }

    const LEAF_NAMES: &[&str] = &[
        "encoding/json.Marshal",
        "database/sql.(*DB).QueryContext",
        "crypto/sha256.block",
        "runtime.mallocgc",
    ];

    #[test]
    fn otlp_json_gives_the_same_rows_as_protobuf() {
        let (bytes, _) = generated();
        let json = profiles_json(&bytes);
        assert_eq!(json[0], b'{');
        assert_eq!(
            decode(Signal::Profiles, &json),
            decode(Signal::Profiles, &bytes)
        );
        let (a, b) = (rows(&bytes), rows(&json));
        for (x, y) in a.columns().iter().zip(b.columns()) {
            if x.data_type()
                != &arrow_schema::DataType::Timestamp(
                    arrow_schema::TimeUnit::Microsecond,
                    Some("+00:00".into()),
                )
            {
                assert_eq!(x.to_data(), y.to_data());
            }
        }
    }

    #[test]
    fn records_that_do_not_hold_together_are_refused_with_the_version() {
        let (bytes, _) = generated();
        let mut data = ProfilesData::decode(bytes.as_slice()).unwrap();
        let stacks = data.dictionary.as_ref().unwrap().stack_table.len();
        data.resource_profiles[0].scope_profiles[0].profiles[0].samples[3].stack_index =
            stacks as i32;
        let refused = decode(Signal::Profiles, &data.encode_to_vec()).unwrap_err();
        let text = refused.to_string();
        assert!(matches!(refused, DecodeError::Profile { .. }));
        assert!(
            text.contains(&format!("stack index {stacks} is outside")),
            "{text}"
        );
        assert!(text.contains(PROTO_VERSION), "{text}");

        let mut data = ProfilesData::decode(bytes.as_slice()).unwrap();
        data.dictionary.as_mut().unwrap().string_table[0] = "cpu".into();
        assert!(decode(Signal::Profiles, &data.encode_to_vec()).is_err());

        let mut data = ProfilesData::decode(bytes.as_slice()).unwrap();
        data.dictionary = None;
        assert!(decode(Signal::Profiles, &data.encode_to_vec()).is_err());

        // A record of another signal is not a profile either.
        let mut generator = Generator::new(1, 1);
        let [traces, _] = generator.requests(2);
        assert!(decode(Signal::Profiles, &traces.bytes).is_err());
        assert!(matches!(
            decode(Signal::Profiles, br#"{"resourceSpans":[]}"#),
            Err(DecodeError::Json { .. })
        ));
        assert!(decode(Signal::Profiles, br#"{"resourceProfiles":[{"scopeProfiles":[{"profiles":[{"timeUnixNano":"x"}]}]}]}"#).is_err());
    }

    #[test]
    fn a_repeated_attribute_key_keeps_its_last_value() {
        let (bytes, _) = generated();
        let mut data = ProfilesData::decode(bytes.as_slice()).unwrap();
        let sample = &mut data.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
        // Attributes 1 and 2 are two worker threads: the same key, two values.
        let (first, other) = (1, 2);
        sample.attribute_indices = vec![first, other];
        let Ok(Decoded::Profiles(decoded)) = decode(Signal::Profiles, &data.encode_to_vec()) else {
            panic!()
        };
        assert_eq!(
            decoded.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].attribute_indices,
            vec![other]
        );
    }

    #[test]
    fn keys_and_values_given_as_string_indices_read_as_strings() {
        use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
        let (bytes, _) = generated();
        let mut data = ProfilesData::decode(bytes.as_slice()).unwrap();
        // As the Collector's pdata writes them: keys and string values in the string table.
        let d = data.dictionary.as_mut().unwrap();
        for rp in &mut data.resource_profiles {
            for kv in &mut rp.resource.as_mut().unwrap().attributes {
                d.string_table.push(std::mem::take(&mut kv.key));
                kv.key_strindex = (d.string_table.len() - 1) as i32;
                if let Some(V::StringValue(text)) = kv.value.as_mut().unwrap().value.take() {
                    d.string_table.push(text);
                    kv.value.as_mut().unwrap().value =
                        Some(V::StringValueStrindex((d.string_table.len() - 1) as i32));
                }
            }
        }
        for a in &mut d.attribute_table[1..] {
            if let Some(V::StringValue(text)) = a.value.as_mut().unwrap().value.take() {
                d.string_table.push(text);
                a.value.as_mut().unwrap().value =
                    Some(V::StringValueStrindex((d.string_table.len() - 1) as i32));
            }
        }
        let indexed = data.encode_to_vec();
        let (a, b) = (rows(&bytes), rows(&indexed));
        for name in [
            "service_name",
            "resource_attributes",
            "sample_attributes",
            "stack_hash",
        ] {
            assert_eq!(
                a.column_by_name(name).unwrap().to_data(),
                b.column_by_name(name).unwrap().to_data(),
                "{name}"
            );
        }
        let json = profiles_json(&indexed);
        assert!(
            decode(Signal::Profiles, &json) == decode(Signal::Profiles, &indexed),
            "the JSON form reads the same"
        );

        data.resource_profiles[0]
            .resource
            .as_mut()
            .unwrap()
            .attributes[0]
            .key_strindex = 10_000;
        let refused = decode(Signal::Profiles, &data.encode_to_vec()).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("string index 10000 is outside"),
            "{refused}"
        );
    }

    #[test]
    fn stack_hashes_depend_on_frames_only() {
        let frame = |function| Frame {
            function,
            file: "f.go",
            line: 3,
            mapping_file: "/bin/a",
            address: 1,
        };
        let moved = Frame {
            address: 99,
            mapping_file: "/bin/b",
            ..frame("a")
        };
        assert_eq!(
            stack_hash([frame("a"), frame("b")]),
            stack_hash([moved, frame("b")])
        );
        assert_ne!(
            stack_hash([frame("a"), frame("b")]),
            stack_hash([frame("b"), frame("a")])
        );
        assert_eq!(stack_hash([frame("a")]).len(), 16);
    }
}
