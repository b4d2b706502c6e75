"""Trino (the server from Maven Central, opt-in: `tests/run --trino`) against floe-catalog:
Trino creates, writes and reads a table through the REST endpoint, reads a table PyIceberg
wrote, and DuckDB reads what Trino wrote."""

import os
import pathlib
import subprocess

import duckdb_offline
import pyarrow as pa
import pytest
import requests
from conftest import attach, start_catalog
from pyiceberg.catalog import load_catalog

pytestmark = pytest.mark.skipif(
    os.environ.get("FLOE_TEST_TRINO") != "1", reason="the Trino tier is opt-in: tests/run --trino"
)

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
