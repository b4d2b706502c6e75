//! Decoding throughput of floe-otlp alone: `cargo bench -p floe-otlp --bench decode`.
//!
//! Generated OTLP traces (1,000 spans per record, protobuf) → `OtlpFormat::append` →
//! `take()` every 64k rows, on one thread, reported as spans/s next to the cost of prost
//! decoding alone (the floor any decoder pays) measured in the same run.

use std::sync::Arc;
use std::time::Instant;

use floe_core::{Format, SourceRecord};
use floe_otlp::OtlpFormat;
use floe_otlp::generate::Generator;
use opentelemetry_proto::tonic::trace::v1::TracesData;
use prost::Message;

// The allocator the `floe` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut generator = Generator::new(5, 1_700_000_000_000_000_000);
    let records: Vec<Vec<u8>> = (0..500)
        .map(|_| generator.requests(200)[0].bytes.clone())
        .collect();
    let spans = records.len() * 1000;
    let topic: Arc<str> = Arc::from("otlp_spans");

    let began = Instant::now();
    let mut decoded = 0;
    for r in &records {
        decoded += TracesData::decode(r.as_slice())
            .unwrap()
            .resource_spans
            .len();
    }
    let prost_only = spans as f64 / began.elapsed().as_secs_f64();
    assert!(decoded > 0);

    let mut format = OtlpFormat::new(Default::default());
    let began = Instant::now();
    let mut rows = 0;
    for (offset, payload) in records.iter().enumerate() {
        let record = SourceRecord {
            topic: topic.clone(),
            partition: 0,
            offset: offset as i64,
            payload: payload.clone(),
            key: None,
        };
        format.append(&record, 0).unwrap();
        if format.buffered_rows() >= 64 * 1024 {
            rows += format
                .take()
                .iter()
                .map(|(_, b)| b.num_rows())
                .sum::<usize>();
        }
    }
    rows += format
        .take()
        .iter()
        .map(|(_, b)| b.num_rows())
        .sum::<usize>();
    let full = spans as f64 / began.elapsed().as_secs_f64();
    assert_eq!(rows, spans);
    println!("prost decode only        {prost_only:>10.0} spans/s");
    println!(
        "decode → Arrow (floe)    {full:>10.0} spans/s   ({:.2} of prost alone)",
        full / prost_only
    );
}
