//! The remote-write 1.0 wire format: a snappy-compressed (block format) protobuf
//! `prometheus.WriteRequest` — the messages of `prompb/remote.proto` and `prompb/types.proto`
//! this sink sends, by field number.

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub(crate) timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`: labels sorted by name, samples by time.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub(crate) labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) samples: Vec<Sample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, prost::Message)]
pub(crate) struct Label {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    #[prost(string, tag = "2")]
    pub(crate) value: String,
}

/// `prometheus.Sample`: a value at a time in milliseconds.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Sample {
    #[prost(double, tag = "1")]
    pub(crate) value: f64,
    #[prost(int64, tag = "2")]
    pub(crate) timestamp: i64,
}

/// The request body: the protobuf, snappy-compressed.
pub(crate) fn body(request: &WriteRequest) -> Result<Vec<u8>, snap::Error> {
    use prost::Message;
    snap::raw::Encoder::new().compress_vec(&request.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_through_snappy_and_protobuf() {
        use prost::Message;
        let request = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![Label {
                    name: "__name__".into(),
                    value: "up".into(),
                }],
                samples: vec![Sample {
                    value: 1.5,
                    timestamp: 1_700_000_000_000,
                }],
            }],
        };
        let compressed = body(&request).unwrap();
        let raw = snap::raw::Decoder::new()
            .decompress_vec(&compressed)
            .unwrap();
        assert_eq!(WriteRequest::decode(raw.as_slice()).unwrap(), request);
        // Field 1 (timeseries), length-delimited: what Prometheus' decoder expects first.
        assert_eq!(raw[0], 0x0a);
    }
}
