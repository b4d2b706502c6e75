"""Trino (the server from Maven Central, resolved by tests/trino/setup) against floe-catalog:
Trino creates, writes and reads a table through the REST endpoint, reads a table PyIceberg
wrote, DuckDB reads what Trino wrote, and Trino's map functions agree on spans whose
attributes repeated a key on the wire (with Kafka, as `floe run` lands them)."""

import os
import pathlib
import subprocess
import uuid

import duckdb_offline
import pyarrow as pa
import pytest
import requests
from conftest import BROKERS, attach, land_otlp, start_catalog
from pyiceberg.catalog import load_catalog

TRINO = pathlib.Path(__file__).resolve().parents[1] / "trino"


def trino(url: str, sql: str) -> list:
    """Runs one statement through Trino's HTTP protocol and returns all rows."""
    headers = {"X-Trino-User": "floe", "X-Trino-Catalog": "lake"}
    response = requests.post(f"{url}/v1/statement", data=sql, headers=headers, timeout=60).json()
    rows = []
    while True:
        if "error" in response:
            raise AssertionError(f"trino: {response['error'].get('message')} ({sql})")
        rows.extend(response.get("data", []))
        if "nextUri" not in response:
            return rows
        response = requests.get(response["nextUri"], headers=headers, timeout=60).json()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with start_catalog(tmp_path_factory.mktemp("trino"), "sqlite", "file") as catalog:
        env = dict(os.environ, FLOE_CATALOG_URI=catalog.uri, FLOE_CATALOG_WAREHOUSE=catalog.name)
        started = subprocess.run([TRINO / "start"], env=env, check=True, capture_output=True, text=True)
        url = started.stdout.strip().splitlines()[-1]
        try:
            yield catalog, url
        finally:
            subprocess.run([TRINO / "stop"], check=False)


def test_trino_creates_writes_and_reads(stack):
    catalog, url = stack
    trino(url, "CREATE SCHEMA lake.trino_made")
    trino(url, "CREATE TABLE lake.trino_made.orders (id BIGINT, customer VARCHAR, amount DOUBLE) WITH (partitioning = ARRAY['customer'])")
    trino(url, "INSERT INTO lake.trino_made.orders VALUES (1, 'ada', 10.5), (2, 'bob', 20.0), (3, 'ada', 1.0)")
    trino(url, "DELETE FROM lake.trino_made.orders WHERE id = 2")
    assert sorted(trino(url, "SELECT id, customer, amount FROM lake.trino_made.orders")) == [[1, "ada", 10.5], [3, "ada", 1.0]]

    con = duckdb_offline.connect()
    attach(con, catalog)
    assert sorted(con.sql("SELECT id FROM lake.trino_made.orders").fetchall()) == [(1,), (3,)]


def test_trino_reads_what_pyiceberg_wrote(stack):
    catalog, url = stack
    cat = load_catalog("floe", **{"type": "rest", **catalog.pyiceberg_props()})
    cat.create_namespace(("py_made",))
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["x", "y", "z"])})
    table = cat.create_table(("py_made", "things"), schema=data.schema)
    table.append(data)
    assert trino(url, "SELECT count(*), max(name) FROM lake.py_made.things") == [[3, "z"]]


def test_trino_map_functions_agree_on_attributes_sent_with_repeated_keys(stack, tmp_path):
    """One span whose attributes repeat a key, as protobuf and as JSON: the functions that
    disagreed (or failed) on a map stored with a duplicate all see one value, the last."""
    if not BROKERS:
        pytest.skip("FLOE_TEST_KAFKA_BROKERS is not set")
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from google.protobuf.json_format import MessageToJson
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, TracesData

    def kv(key, value):
        return KeyValue(key=key, value=AnyValue(string_value=value))

    span = Span(
        trace_id=bytes(range(1, 17)),
        span_id=bytes(range(1, 9)),
        name="repeated-keys",
        start_time_unix_nano=1_700_000_000_000_000_000,
        end_time_unix_nano=1_700_000_000_000_001_000,
        attributes=[kv("dup.key", "first"), kv("http.request.method", "GET"), kv("dup.key", "last")],
    )
    resource = Resource(attributes=[kv("service.name", "dups"), kv("host.name", "first"), kv("host.name", "last")])
    request = TracesData(resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=[span])])])
    topic = f"dup_spans_{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": BROKERS})
    for f in admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)]).values():
        f.result()
    producer = Producer({"bootstrap.servers": BROKERS})
    producer.produce(topic, request.SerializeToString(), partition=0)
    producer.produce(topic, MessageToJson(request).encode(), partition=1)
    assert producer.flush(30) == 0

    catalog, url = stack
    land_otlp(tmp_path, catalog, {"traces": topic}, {f"{topic}/0": 1, f"{topic}/1": 1}, "dups")
    rows = trino(
        url,
        "SELECT element_at(span_attributes, 'dup.key'), json_format(CAST(span_attributes AS json)), "
        "cardinality(transform_keys(span_attributes, (k, v) -> upper(k))), "
        "element_at(resource_attributes, 'host.name') FROM lake.dups.otel_spans",
    )
    assert rows == [["last", '{"dup.key":"last","http.request.method":"GET"}', 2, "last"]] * 2, rows
