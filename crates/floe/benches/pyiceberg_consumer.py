"""The baseline a user would otherwise write: a confluent-kafka consumer that decodes OTLP spans
with the `opentelemetry-proto` Python classes, flattens them into a pyarrow table with the same
columns as Floe's `otel_spans` and calls PyIceberg's `table.append` every 10 seconds through the
same REST catalog.

usage: pyiceberg_consumer.py BROKERS TOPIC CATALOG_URI EXPECTED_SPANS
Prints the number of spans appended when it has read EXPECTED_SPANS.
"""

import sys
import time
import uuid

import pyarrow as pa
from confluent_kafka import Consumer
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError

brokers, topic, uri, expected = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
catalog = load_catalog("bench", uri=uri)
try:
    catalog.create_namespace("pybench")
except NamespaceAlreadyExistsError:
    pass
strmap = pa.map_(pa.string(), pa.string())
# The columns of Floe's otel_spans table, so both write the same table.
schema = pa.schema(
    [
        ("ts", pa.timestamp("us", tz="UTC")),
        ("start_time_unix_nano", pa.int64()),
        ("end_time_unix_nano", pa.int64()),
        ("duration_ns", pa.int64()),
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("parent_span_id", pa.string()),
        ("is_root", pa.bool_()),
        ("trace_state", pa.string()),
        ("flags", pa.int32()),
        ("span_name", pa.string()),
        ("span_kind", pa.string()),
        ("status_code", pa.string()),
        ("status_message", pa.string()),
        ("span_attributes", strmap),
        ("dropped_attributes_count", pa.int32()),
        ("dropped_events_count", pa.int32()),
        ("dropped_links_count", pa.int32()),
        (
            "events",
            pa.list_(
                pa.struct(
                    [
                        ("ts", pa.timestamp("us", tz="UTC")),
                        ("time_unix_nano", pa.int64()),
                        ("name", pa.string()),
                        ("attributes", strmap),
                        ("dropped_attributes_count", pa.int32()),
                    ]
                )
            ),
        ),
        (
            "links",
            pa.list_(
                pa.struct(
                    [
                        ("trace_id", pa.string()),
                        ("span_id", pa.string()),
                        ("trace_state", pa.string()),
                        ("flags", pa.int32()),
                        ("attributes", strmap),
                        ("dropped_attributes_count", pa.int32()),
                    ]
                )
            ),
        ),
        ("service_name", pa.string()),
        ("service_namespace", pa.string()),
        ("service_instance_id", pa.string()),
        ("deployment_environment", pa.string()),
        ("resource_attributes", strmap),
        ("resource_schema_url", pa.string()),
        ("resource_dropped_attributes_count", pa.int32()),
        ("scope_name", pa.string()),
        ("scope_version", pa.string()),
        ("scope_attributes", strmap),
        ("scope_schema_url", pa.string()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_item", pa.int32()),
        ("ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)
KINDS = ["UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"]
CODES = ["UNSET", "OK", "ERROR"]


def value(v):
    kind = v.WhichOneof("value")
    x = getattr(v, kind) if kind else ""
    return str(x).lower() if isinstance(x, bool) else str(x)


def attrs(kvs):
    return [(a.key, value(a.value)) for a in kvs]


table = catalog.create_table(f"pybench.spans_{uuid.uuid4().hex[:8]}", schema=schema)
consumer = Consumer(
    {"bootstrap.servers": brokers, "group.id": f"pybench-{uuid.uuid4()}", "auto.offset.reset": "earliest", "enable.auto.commit": False}
)
consumer.subscribe([topic])
columns = {name: [] for name in schema.names}
seen = 0
last = time.monotonic()


def flush():
    global columns
    if columns["trace_id"]:
        table.append(pa.table(columns, schema=schema))
        consumer.commit(asynchronous=False)
    columns = {name: [] for name in schema.names}


while seen < expected:
    for message in consumer.consume(num_messages=500, timeout=0.5):
        if message.error():
            continue
        data = TracesData()
        data.ParseFromString(message.value())
        now = int(time.time() * 1e6)
        item = 0
        for rs in data.resource_spans:
            res = dict(attrs(rs.resource.attributes))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    row = {
                        "ts": s.start_time_unix_nano // 1000,
                        "start_time_unix_nano": s.start_time_unix_nano,
                        "end_time_unix_nano": s.end_time_unix_nano,
                        "duration_ns": max(0, s.end_time_unix_nano - s.start_time_unix_nano),
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex() or None,
                        "is_root": not s.parent_span_id,
                        "trace_state": s.trace_state or None,
                        "flags": s.flags,
                        "span_name": s.name,
                        "span_kind": KINDS[s.kind] if s.kind < len(KINDS) else "UNSPECIFIED",
                        "status_code": CODES[s.status.code] if s.status.code < 3 else "UNSET",
                        "status_message": s.status.message or None,
                        "span_attributes": attrs(s.attributes),
                        "dropped_attributes_count": s.dropped_attributes_count,
                        "dropped_events_count": s.dropped_events_count,
                        "dropped_links_count": s.dropped_links_count,
                        "events": [
                            {
                                "ts": e.time_unix_nano // 1000,
                                "time_unix_nano": e.time_unix_nano,
                                "name": e.name,
                                "attributes": attrs(e.attributes),
                                "dropped_attributes_count": e.dropped_attributes_count,
                            }
                            for e in s.events
                        ],
                        "links": [
                            {
                                "trace_id": l.trace_id.hex(),
                                "span_id": l.span_id.hex(),
                                "trace_state": l.trace_state,
                                "flags": l.flags,
                                "attributes": attrs(l.attributes),
                                "dropped_attributes_count": l.dropped_attributes_count,
                            }
                            for l in s.links
                        ],
                        "service_name": res.get("service.name", "unknown_service"),
                        "service_namespace": res.get("service.namespace"),
                        "service_instance_id": res.get("service.instance.id"),
                        "deployment_environment": res.get("deployment.environment.name"),
                        "resource_attributes": list(res.items()),
                        "resource_schema_url": rs.schema_url or None,
                        "resource_dropped_attributes_count": rs.resource.dropped_attributes_count,
                        "scope_name": ss.scope.name or None,
                        "scope_version": ss.scope.version or None,
                        "scope_attributes": attrs(ss.scope.attributes),
                        "scope_schema_url": ss.schema_url or None,
                        "kafka_topic": message.topic(),
                        "kafka_partition": message.partition(),
                        "kafka_offset": message.offset(),
                        "kafka_item": item,
                        "ingested_at": now,
                    }
                    for name in schema.names:
                        columns[name].append(row[name])
                    item += 1
                    seen += 1
    if time.monotonic() - last >= 10:
        flush()
        last = time.monotonic()
flush()
consumer.close()
print(seen)
