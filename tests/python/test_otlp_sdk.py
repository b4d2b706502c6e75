"""OTLP made by the OpenTelemetry Python SDK, encoded by its own OTLP protobuf encoder (and as
protobuf JSON), produced onto Kafka, ingested by `floe run`, and read back by DuckDB: exactly the
produced counts per signal, and the sampled values (ids, timestamps, attributes, histogram
buckets, log bodies) as the SDK made them.

Needs FLOE_TEST_KAFKA_BROKERS; the `floe` binary comes from FLOE_BIN, else
$CARGO_TARGET_DIR/debug/floe.
"""

import uuid

import pytest
from conftest import BROKERS, REQUIRED, land_otlp, start_catalog

if REQUIRED:
    assert BROKERS, "FLOE_REQUIRE_SERVICES=1 needs FLOE_TEST_KAFKA_BROKERS"
pytestmark = pytest.mark.skipif(not BROKERS, reason="FLOE_TEST_KAFKA_BROKERS is not set")


def sdk_requests():
    """Spans, logs and metrics made with the SDK, as the SDK's OTLP exporter encodes them."""
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    resource = Resource.create({"service.name": "sdk-shop", "deployment.environment.name": "test"})
    spans_out = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans_out))
    tracer = tracer_provider.get_tracer("floe.test", "1.0")
    for i in range(40):
        with tracer.start_as_current_span("GET /items", attributes={"http.route": "/items", "i": i}) as root:
            with tracer.start_as_current_span("SELECT items") as child:
                child.add_event("rows", {"count": i})
                if i % 10 == 0:
                    child.set_status(Status(StatusCode.ERROR, "boom"))
            root.set_attribute("ok", i % 10 != 0)
    spans = spans_out.get_finished_spans()

    logs_out = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs_out))
    import logging
    import warnings

    from opentelemetry.sdk._logs import LoggingHandler

    py_logger = logging.getLogger("floe-sdk-test")
    py_logger.setLevel(logging.INFO)
    with warnings.catch_warnings():
        # The SDK's bridge from `logging` still works; its successor is another package.
        warnings.simplefilter("ignore", DeprecationWarning)
        handler = LoggingHandler(logger_provider=logger_provider)
    py_logger.addHandler(handler)
    for i in range(25):
        py_logger.warning("item %d is low", i)
    py_logger.removeHandler(handler)
    logs = logs_out.get_finished_logs()

    reader = InMemoryMetricReader()
    meter = MeterProvider(resource=resource, metric_readers=[reader]).get_meter("floe.test")
    counter = meter.create_counter("items.sold")
    histogram = meter.create_histogram("latency", unit="ms")
    for i in range(30):
        counter.add(1, {"shop": "a"})
        histogram.record(float(i * 7), {"shop": "a"})
    metrics = reader.get_metrics_data()
    return spans, encode_spans(spans), logs, encode_logs(logs), metrics, encode_metrics(metrics)


def test_sdk_otlp_through_kafka_lands_exactly(tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from google.protobuf.json_format import MessageToJson

    spans, span_req, logs, log_req, metrics, metric_req = sdk_requests()
    run = uuid.uuid4().hex[:10]
    topics = {"traces": f"sdk_spans_{run}", "logs": f"sdk_logs_{run}", "metrics": f"sdk_metrics_{run}"}
    admin = AdminClient({"bootstrap.servers": BROKERS})
    for f in admin.create_topics([NewTopic(t, num_partitions=2, replication_factor=1) for t in topics.values()]).values():
        f.result()
    producer = Producer({"bootstrap.servers": BROKERS})
    # Each request twice: the SDK's protobuf bytes, and protobuf JSON (base64 ids, enum names,
    # int64 as strings — what generic protobuf tooling writes).
    for signal_name, request in (("traces", span_req), ("logs", log_req), ("metrics", metric_req)):
        producer.produce(topics[signal_name], request.SerializeToString(), partition=0)
        producer.produce(topics[signal_name], MessageToJson(request).encode(), partition=1)
    assert producer.flush(30) == 0

    with start_catalog(tmp_path, "sqlite", "file") as catalog:
        ends = {f"{t}/{p}": 1 for t in topics.values() for p in (0, 1)}
        land_otlp(tmp_path, catalog, topics, ends, "sdk")

        import duckdb_offline

        con = duckdb_offline.connect()
        con.sql(f"ATTACH 'wh' AS lake (TYPE iceberg, ENDPOINT '{catalog.uri}', AUTHORIZATION_TYPE 'none')")

        def one(q):
            return con.sql(q).fetchone()

        points = sum(len(m.data.data_points) for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)
        assert one("SELECT count(*) FROM lake.sdk.otel_spans")[0] == 2 * len(spans)
        assert one("SELECT count(*) FROM lake.sdk.otel_logs")[0] == 2 * len(logs)
        sums = one("SELECT count(*) FROM lake.sdk.otel_metrics_sum")[0]
        histograms = one("SELECT count(*) FROM lake.sdk.otel_metrics_histogram")[0]
        assert sums + histograms == 2 * points
        assert one("SELECT count(*) FROM lake.sdk.floe_dead_letters")[0] == 0

        # Sampled values, from both encodings.
        for span in (spans[0], spans[-1]):
            trace_id = format(span.context.trace_id, "032x")
            span_id = format(span.context.span_id, "016x")
            rows = con.sql(
                f"SELECT span_name, start_time_unix_nano, end_time_unix_nano, span_attributes, span_kind, "
                f"status_code, parent_span_id, service_name, len(events) "
                f"FROM lake.sdk.otel_spans WHERE trace_id = '{trace_id}' AND span_id = '{span_id}'"
            ).fetchall()
            assert len(rows) == 2, rows
            for name, start, end, attrs, kind, status, parent, service, events in rows:
                assert name == span.name and start == span.start_time and end == span.end_time
                assert kind == "INTERNAL" and service == "sdk-shop"
                assert status == ("ERROR" if span.status.status_code.name == "ERROR" else "UNSET")
                assert parent == (format(span.parent.span_id, "016x") if span.parent else None)
                assert events == len(span.events)
                for key, value in span.attributes.items():
                    expected = str(value).lower() if isinstance(value, bool) else str(value)
                    assert attrs[key] == expected, (key, attrs)
        bodies = con.sql("SELECT DISTINCT body FROM lake.sdk.otel_logs WHERE severity_number = 13 ORDER BY body").fetchall()
        assert len(bodies) == len(logs) and bodies[0][0].startswith("item ")
        latency = next(
            m for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == "latency"
        ).data.data_points[0]
        rows = con.sql(
            "SELECT count, sum, bucket_counts, explicit_bounds, attributes['shop'] FROM lake.sdk.otel_metrics_histogram"
        ).fetchall()
        assert len(rows) == 2
        for count, total, buckets, bounds, shop in rows:
            assert count == latency.count and total == latency.sum and shop == "a"
            assert buckets == list(latency.bucket_counts) and bounds == list(latency.explicit_bounds)
