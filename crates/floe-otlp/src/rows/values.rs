//! OTLP values as Floe writes them: ids as lowercase hex, attribute values as strings or
//! JSON, times in µs, and the enum names of span kinds and status codes.

use super::*;

pub(super) fn nanos_to_micros(unix_nano: u64) -> i64 {
    (unix_nano / 1_000) as i64
}

/// Lowercase hex of an id; `None` for an empty or all-zero id.
pub fn hex_id(bytes: &[u8]) -> Option<String> {
    let mut buffer = vec![0u8; bytes.len() * 2];
    hex_into(bytes, &mut buffer).map(str::to_string)
}

/// Lowercase hex of an id written into `buffer`; `None` for an empty or all-zero id, or one
/// longer than half the buffer.
pub(super) fn hex_into<'b>(bytes: &[u8], buffer: &'b mut [u8]) -> Option<&'b str> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    if bytes.iter().all(|b| *b == 0) || bytes.len() * 2 > buffer.len() {
        return None;
    }
    for (i, b) in bytes.iter().enumerate() {
        buffer[2 * i] = DIGITS[(b >> 4) as usize];
        buffer[2 * i + 1] = DIGITS[(b & 0x0f) as usize];
    }
    std::str::from_utf8(&buffer[..bytes.len() * 2]).ok()
}

/// An attribute value as a string: scalars as text, bytes as base64, arrays and kvlists as JSON.
pub fn any_to_string(value: &AnyValue) -> String {
    let mut out = String::new();
    write_any(value, &mut out);
    out
}

/// [`any_to_string`] into a reused buffer.
pub(super) fn write_any(value: &AnyValue, out: &mut String) {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => out.push_str(s),
        Some(any_value::Value::BoolValue(b)) => out.push_str(if *b { "true" } else { "false" }),
        Some(any_value::Value::IntValue(i)) => {
            let _ = write!(out, "{i}");
        }
        Some(any_value::Value::DoubleValue(d)) => {
            let _ = write!(out, "{d}");
        }
        Some(any_value::Value::BytesValue(b)) => {
            base64::engine::general_purpose::STANDARD.encode_string(b, out)
        }
        Some(any_value::Value::ArrayValue(_)) | Some(any_value::Value::KvlistValue(_)) => {
            let _ = write!(out, "{}", any_to_json(value));
        }
        // String-table references (profiles only) and unset values.
        Some(any_value::Value::StringValueStrindex(i)) => {
            let _ = write!(out, "{i}");
        }
        None => {}
    }
}

pub(super) fn any_to_json(value: &AnyValue) -> serde_json::Value {
    use serde_json::Value as J;
    match &value.value {
        Some(any_value::Value::StringValue(s)) => J::from(s.as_str()),
        Some(any_value::Value::BoolValue(b)) => J::from(*b),
        Some(any_value::Value::IntValue(i)) => J::from(*i),
        Some(any_value::Value::DoubleValue(d)) => J::from(*d),
        Some(any_value::Value::BytesValue(b)) => {
            J::from(base64::engine::general_purpose::STANDARD.encode(b))
        }
        Some(any_value::Value::ArrayValue(a)) => {
            J::Array(a.values.iter().map(any_to_json).collect())
        }
        Some(any_value::Value::KvlistValue(kv)) => J::Object(
            kv.values
                .iter()
                .map(|kv| {
                    let v = kv.value.as_ref().map(any_to_json).unwrap_or(J::Null);
                    (kv.key.clone(), v)
                })
                .collect(),
        ),
        Some(any_value::Value::StringValueStrindex(i)) => J::from(*i),
        None => J::Null,
    }
}

pub(super) fn body_type(value: Option<&AnyValue>) -> &'static str {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(_)) => "string",
        Some(any_value::Value::BoolValue(_)) => "bool",
        Some(any_value::Value::IntValue(_)) => "int",
        Some(any_value::Value::DoubleValue(_)) => "double",
        Some(any_value::Value::BytesValue(_)) => "bytes",
        Some(any_value::Value::ArrayValue(_)) => "array",
        Some(any_value::Value::KvlistValue(_)) => "kvlist",
        Some(any_value::Value::StringValueStrindex(_)) => "int",
        None => "empty",
    }
}

pub(super) fn span_kind(kind: i32) -> &'static str {
    match kind {
        1 => "INTERNAL",
        2 => "SERVER",
        3 => "CLIENT",
        4 => "PRODUCER",
        5 => "CONSUMER",
        _ => "UNSPECIFIED",
    }
}

pub(super) fn status_code(code: i32) -> &'static str {
    match code {
        1 => "OK",
        2 => "ERROR",
        _ => "UNSET",
    }
}
