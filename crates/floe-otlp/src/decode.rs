//! One Kafka record → one decoded OTLP request, protobuf or JSON, detected per record.
//!
//! The Collector's Kafka exporter writes one self-contained `TracesData` / `LogsData` /
//! `MetricsData` / `ProfilesData` per record, as `otlp_proto` (default) or `otlp_json`. A record
//! whose first non-blank byte is `{` is JSON; anything else is protobuf. Profiles are checked
//! against the one version of the development-stage profiles protocol Floe reads
//! ([`crate::profiles`]).
//!
//! JSON goes through a normalisation pass before serde, because `opentelemetry-proto`'s serde
//! decoding is stricter than what producers send (`../shared/reference/otlp.md` §2):
//! snake_case field names are renamed to the spec's lowerCamelCase (otherwise they are silently
//! ignored and the record decodes as empty), enum names (`"SPAN_KIND_SERVER"`) become their
//! numbers, and base64 trace and span ids (proto3 canonical JSON) become hex.

use base64::Engine as _;
use opentelemetry_proto::tonic::logs::v1::LogsData;
use opentelemetry_proto::tonic::metrics::v1::MetricsData;
use opentelemetry_proto::tonic::profiles::v1development::ProfilesData;
use opentelemetry_proto::tonic::trace::v1::TracesData;
use prost::Message as _;
use serde_json::Value;

/// Which OTLP signal a topic carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// `TracesData`.
    Traces,
    /// `LogsData`.
    Logs,
    /// `MetricsData`.
    Metrics,
    /// `ProfilesData` (`opentelemetry.proto.profiles.v1development`).
    Profiles,
}

impl Signal {
    /// The signal of one of the Collector's default topics (`otlp_spans`, `otlp_logs`,
    /// `otlp_metrics`, `otlp_profiles`).
    pub fn of_default_topic(topic: &str) -> Option<Self> {
        match topic {
            "otlp_spans" => Some(Signal::Traces),
            "otlp_logs" => Some(Signal::Logs),
            "otlp_metrics" => Some(Signal::Metrics),
            "otlp_profiles" => Some(Signal::Profiles),
            _ => None,
        }
    }

    /// Parses `traces` / `logs` / `metrics` / `profiles`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "traces" | "spans" => Some(Signal::Traces),
            "logs" => Some(Signal::Logs),
            "metrics" => Some(Signal::Metrics),
            "profiles" => Some(Signal::Profiles),
            _ => None,
        }
    }
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// Spans.
    Traces(TracesData),
    /// Log records.
    Logs(LogsData),
    /// Metrics.
    Metrics(MetricsData),
    /// Profiles, checked against their dictionary.
    Profiles(ProfilesData),
}

/// Why a record could not be decoded (it goes to the dead-letter table with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not valid protobuf of the signal's message.
    #[error("not a valid OTLP protobuf {signal:?} message: {reason}")]
    Protobuf {
        /// The expected signal.
        signal: Signal,
        /// prost's message.
        reason: String,
    },
    /// Not valid OTLP JSON of the signal.
    #[error("not valid OTLP JSON for {signal:?}: {reason}")]
    Json {
        /// The expected signal.
        signal: Signal,
        /// serde's message.
        reason: String,
    },
    /// A profile that does not hold together as the profiles protocol Floe reads.
    #[error("{reason} (Floe reads opentelemetry.proto.profiles.v1development of OTLP {version}; a record of another version of the development-stage protocol decodes like this)", version = crate::profiles::PROTO_VERSION)]
    Profile {
        /// What does not hold together.
        reason: String,
    },
    /// An empty record (no bytes).
    #[error("empty record")]
    Empty,
}

/// Decodes one record of `signal`, with every attribute map's keys made unique
/// ([`crate::attributes`]).
pub fn decode(signal: Signal, bytes: &[u8]) -> Result<Decoded, DecodeError> {
    decode_counted(signal, bytes).map(|(decoded, _)| decoded)
}

/// [`decode`], and how many attribute entries lost to a later one of the same key.
pub fn decode_counted(signal: Signal, bytes: &[u8]) -> Result<(Decoded, u64), DecodeError> {
    let Some(first) = bytes.iter().find(|b| !b.is_ascii_whitespace()) else {
        return Err(DecodeError::Empty);
    };
    let mut decoded = if *first == b'{' {
        decode_json(signal, bytes)?
    } else {
        decode_protobuf(signal, bytes)?
    };
    if let Decoded::Profiles(data) = &mut decoded {
        crate::profiles::check(data)
            .and_then(|()| crate::profiles::resolve_strings(data))
            .map_err(|reason| DecodeError::Profile { reason })?;
    }
    let dropped = crate::attributes::unique_keys_in(&mut decoded);
    Ok((decoded, dropped))
}

fn decode_protobuf(signal: Signal, bytes: &[u8]) -> Result<Decoded, DecodeError> {
    let error = |e: prost::DecodeError| DecodeError::Protobuf {
        signal,
        reason: e.to_string(),
    };
    Ok(match signal {
        Signal::Traces => Decoded::Traces(TracesData::decode(bytes).map_err(error)?),
        Signal::Logs => Decoded::Logs(LogsData::decode(bytes).map_err(error)?),
        Signal::Metrics => Decoded::Metrics(MetricsData::decode(bytes).map_err(error)?),
        Signal::Profiles => Decoded::Profiles(ProfilesData::decode(bytes).map_err(error)?),
    })
}

fn decode_json(signal: Signal, bytes: &[u8]) -> Result<Decoded, DecodeError> {
    let error = |e: serde_json::Error| DecodeError::Json {
        signal,
        reason: e.to_string(),
    };
    let mut value: Value = serde_json::from_slice(bytes).map_err(error)?;
    normalise(&mut value);
    let top = match signal {
        Signal::Traces => "resourceSpans",
        Signal::Logs => "resourceLogs",
        Signal::Metrics => "resourceMetrics",
        Signal::Profiles => "resourceProfiles",
    };
    // A JSON object of another signal (or none) would decode as an empty request: refuse it.
    if value.get(top).is_none() {
        return Err(DecodeError::Json {
            signal,
            reason: format!("no `{top}` field"),
        });
    }
    Ok(match signal {
        Signal::Traces => Decoded::Traces(serde_json::from_value(value).map_err(error)?),
        Signal::Logs => Decoded::Logs(serde_json::from_value(value).map_err(error)?),
        Signal::Metrics => Decoded::Metrics(serde_json::from_value(value).map_err(error)?),
        // opentelemetry-proto's serde of profiles is not OTLP JSON (64-bit integers as
        // strings, omitted defaults, hex ids): read by our own mapping.
        Signal::Profiles => Decoded::Profiles(
            crate::profiles::from_json(value)
                .map_err(|reason| DecodeError::Json { signal, reason })?,
        ),
    })
}

/// Rewrites what producers send into what the spec (and `opentelemetry-proto`'s serde) accepts.
fn normalise(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut inner) in entries {
                let key = camel_case(&key);
                normalise(&mut inner);
                match key.as_str() {
                    "kind" => enum_to_number(&mut inner, SPAN_KINDS),
                    "code" => enum_to_number(&mut inner, STATUS_CODES),
                    "severityNumber" => enum_to_number(&mut inner, SEVERITIES),
                    "aggregationTemporality" => enum_to_number(&mut inner, TEMPORALITIES),
                    "traceId" => base64_to_hex(&mut inner, 16),
                    "spanId" | "parentSpanId" => base64_to_hex(&mut inner, 8),
                    _ => {}
                }
                map.insert(key, inner);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalise),
        _ => {}
    }
}

fn camel_case(key: &str) -> String {
    if !key.contains('_') {
        return key.to_string();
    }
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

const SPAN_KINDS: &[&str] = &[
    "SPAN_KIND_UNSPECIFIED",
    "SPAN_KIND_INTERNAL",
    "SPAN_KIND_SERVER",
    "SPAN_KIND_CLIENT",
    "SPAN_KIND_PRODUCER",
    "SPAN_KIND_CONSUMER",
];
const STATUS_CODES: &[&str] = &["STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"];
const TEMPORALITIES: &[&str] = &[
    "AGGREGATION_TEMPORALITY_UNSPECIFIED",
    "AGGREGATION_TEMPORALITY_DELTA",
    "AGGREGATION_TEMPORALITY_CUMULATIVE",
];
const SEVERITIES: &[&str] = &[
    "SEVERITY_NUMBER_UNSPECIFIED",
    "SEVERITY_NUMBER_TRACE",
    "SEVERITY_NUMBER_TRACE2",
    "SEVERITY_NUMBER_TRACE3",
    "SEVERITY_NUMBER_TRACE4",
    "SEVERITY_NUMBER_DEBUG",
    "SEVERITY_NUMBER_DEBUG2",
    "SEVERITY_NUMBER_DEBUG3",
    "SEVERITY_NUMBER_DEBUG4",
    "SEVERITY_NUMBER_INFO",
    "SEVERITY_NUMBER_INFO2",
    "SEVERITY_NUMBER_INFO3",
    "SEVERITY_NUMBER_INFO4",
    "SEVERITY_NUMBER_WARN",
    "SEVERITY_NUMBER_WARN2",
    "SEVERITY_NUMBER_WARN3",
    "SEVERITY_NUMBER_WARN4",
    "SEVERITY_NUMBER_ERROR",
    "SEVERITY_NUMBER_ERROR2",
    "SEVERITY_NUMBER_ERROR3",
    "SEVERITY_NUMBER_ERROR4",
    "SEVERITY_NUMBER_FATAL",
    "SEVERITY_NUMBER_FATAL2",
    "SEVERITY_NUMBER_FATAL3",
    "SEVERITY_NUMBER_FATAL4",
];

fn enum_to_number(value: &mut Value, names: &[&str]) {
    if let Value::String(name) = value
        && let Some(index) = names.iter().position(|n| n == name)
    {
        *value = Value::from(index);
    }
}

fn base64_to_hex(value: &mut Value, len: usize) {
    let Value::String(text) = value else {
        return;
    };
    if text.is_empty() || (text.len() == len * 2 && text.bytes().all(|b| b.is_ascii_hexdigit())) {
        return;
    }
    let engine = base64::engine::general_purpose::STANDARD;
    if let Ok(bytes) = engine.decode(text.as_bytes())
        && bytes.len() == len
    {
        *value = Value::from(crate::rows::hex_id(&bytes).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_normalised_before_decoding() {
        let json = br#"{"resource_spans":[{"scope_spans":[{"spans":[{
            "trace_id":"AAECAwQFBgcICQoLDA0ODw==","span_id":"5B8EFFF798038103",
            "name":"GET /","kind":"SPAN_KIND_SERVER","start_time_unix_nano":"1000",
            "status":{"code":"STATUS_CODE_ERROR"}}]}]}]}"#;
        let Decoded::Traces(data) = decode(Signal::Traces, json).unwrap() else {
            panic!("traces expected");
        };
        let span = &data.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.kind, 2);
        assert_eq!(span.start_time_unix_nano, 1000);
        assert_eq!(span.status.as_ref().unwrap().code, 2);
        assert_eq!(
            crate::rows::hex_id(&span.trace_id).unwrap(),
            "000102030405060708090a0b0c0d0e0f"
        );
        assert_eq!(
            crate::rows::hex_id(&span.span_id).unwrap(),
            "5b8efff798038103"
        );
    }

    #[test]
    fn bad_records_are_errors() {
        assert_eq!(decode(Signal::Logs, b"  "), Err(DecodeError::Empty));
        assert!(matches!(
            decode(Signal::Traces, &[0x0a, 0xff, 0x01]),
            Err(DecodeError::Protobuf { .. })
        ));
        assert!(matches!(
            decode(Signal::Logs, br#"{"resourceLogs": 5}"#),
            Err(DecodeError::Json { .. })
        ));
        assert!(matches!(
            decode(Signal::Metrics, br#"{"resourceSpans": []}"#),
            Err(DecodeError::Json { .. })
        ));
    }
}
