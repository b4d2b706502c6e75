"""The baseline a user would otherwise write: a confluent-kafka consumer that decodes OTLP spans
with the `opentelemetry-proto` Python classes, flattens them into a pyarrow table and calls
PyIceberg's `table.append` every 10 seconds through the same REST catalog.

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
schema = pa.schema(
    [
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("parent_span_id", pa.string()),
        ("span_name", pa.string()),
        ("service_name", pa.string()),
        ("start_time_unix_nano", pa.int64()),
        ("end_time_unix_nano", pa.int64()),
        ("status_code", pa.int32()),
        ("span_attributes", pa.map_(pa.string(), pa.string())),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
    ]
)
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
        for rs in data.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), None)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    columns["trace_id"].append(s.trace_id.hex())
                    columns["span_id"].append(s.span_id.hex())
                    columns["parent_span_id"].append(s.parent_span_id.hex() or None)
                    columns["span_name"].append(s.name)
                    columns["service_name"].append(service)
                    columns["start_time_unix_nano"].append(s.start_time_unix_nano)
                    columns["end_time_unix_nano"].append(s.end_time_unix_nano)
                    columns["status_code"].append(s.status.code)
                    columns["span_attributes"].append(
                        [(a.key, str(getattr(a.value, a.value.WhichOneof("value")))) for a in s.attributes]
                    )
                    columns["kafka_partition"].append(message.partition())
                    columns["kafka_offset"].append(message.offset())
                    seen += 1
    if time.monotonic() - last >= 10:
        flush()
        last = time.monotonic()
flush()
consumer.close()
print(seen)
