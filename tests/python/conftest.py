"""Fixtures for the client tests: a real `floe-catalog` process per test, on every store x
warehouse this run can reach.

SQLite with a local warehouse always runs; Postgres when FLOE_TEST_PG_URL is set and S3 (moto)
when FLOE_TEST_S3_ENDPOINT is set. With FLOE_REQUIRE_SERVICES=1 (as `tests/run` sets) a missing
service fails the run instead of skipping. The binary comes from FLOE_CATALOG_BIN, else from
$CARGO_TARGET_DIR/debug.
"""

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

import pytest
import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "services" / "python"))

REQUIRED = os.environ.get("FLOE_REQUIRE_SERVICES") == "1"
BROKERS = os.environ.get("FLOE_TEST_KAFKA_BROKERS")


def _binary(name: str, variable: str) -> str:
    """A binary of the workspace: `variable` from the environment, else
    $CARGO_TARGET_DIR/debug/`name`."""
    explicit = os.environ.get(variable)
    if explicit:
        return explicit
    target = os.environ.get("CARGO_TARGET_DIR") or str(pathlib.Path(__file__).resolve().parents[2] / "target")
    return str(pathlib.Path(target) / "debug" / name)


def _backends():
    out = [("sqlite", "file")]
    pg, s3 = os.environ.get("FLOE_TEST_PG_URL"), os.environ.get("FLOE_TEST_S3_ENDPOINT")
    if REQUIRED:
        assert pg and s3, "FLOE_REQUIRE_SERVICES=1 needs FLOE_TEST_PG_URL and FLOE_TEST_S3_ENDPOINT"
    if pg:
        out.append(("postgres", "file"))
    if s3:
        out.append(("sqlite", "s3"))
        if pg:
            out.append(("postgres", "s3"))
    return out


@dataclass
class Catalog:
    """A running floe-catalog."""

    uri: str
    name: str
    warehouse: str
    store: str
    local_dir: pathlib.Path | None
    process: subprocess.Popen = field(repr=False)

    @property
    def s3(self) -> bool:
        return self.warehouse.startswith("s3://")

    def pyiceberg_props(self) -> dict:
        props = {"uri": self.uri, "warehouse": self.name}
        if self.s3:
            props.update(
                {
                    "s3.endpoint": os.environ["FLOE_TEST_S3_ENDPOINT"],
                    "s3.access-key-id": os.environ.get("AWS_ACCESS_KEY_ID", "test"),
                    "s3.secret-access-key": os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
                    "s3.region": os.environ.get("AWS_REGION", "us-east-1"),
                    "s3.force-virtual-addressing": "false",
                }
            )
        return props

    def exists(self, location: str) -> bool:
        """Whether a file the catalog knows of exists in the warehouse."""
        if location.startswith("file://"):
            return pathlib.Path(location[len("file://"):]).exists()
        import boto3

        bucket, key = location[len("s3://"):].split("/", 1)
        s3 = boto3.client("s3", endpoint_url=os.environ["FLOE_TEST_S3_ENDPOINT"])
        return s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0) > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def start_catalog(tmp_path: pathlib.Path, store_kind: str, wh_kind: str):
    """Runs a floe-catalog process on a unique catalog name until the block ends, then checks
    that it stops cleanly on SIGTERM."""
    name = "py" + uuid.uuid4().hex[:10]
    store = f"sqlite://{tmp_path / 'catalog.db'}" if store_kind == "sqlite" else os.environ["FLOE_TEST_PG_URL"]
    if wh_kind == "file":
        local_dir = tmp_path / "warehouse"
        warehouse = f"file://{local_dir}"
    else:
        local_dir = None
        warehouse = f"s3://{os.environ.get('FLOE_TEST_S3_BUCKET', 'floe-test')}/{name}"
    port = _free_port()
    env = dict(os.environ, RUST_LOG="warn")
    if wh_kind == "s3":
        env.update(FLOE_S3_ENDPOINT=os.environ["FLOE_TEST_S3_ENDPOINT"], FLOE_S3_PATH_STYLE="true")
    process = subprocess.Popen(
        [_binary("floe-catalog", "FLOE_CATALOG_BIN"), "--listen", f"127.0.0.1:{port}", "--store", store, "--warehouse", warehouse, "--name", name],
        env=env,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"{uri}/healthz", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            assert process.poll() is None, "floe-catalog exited during start-up"
            assert time.monotonic() < deadline, "floe-catalog did not become healthy"
            time.sleep(0.05)
        yield Catalog(uri=uri, name=name, warehouse=warehouse, store=store, local_dir=local_dir, process=process)
    finally:
        process.terminate()
        code = process.wait(timeout=20)
    assert code == 0, f"floe-catalog exited with {code} on SIGTERM"


@pytest.fixture(params=_backends(), ids=lambda b: f"{b[0]}+{b[1]}")
def catalog(request, tmp_path):
    with start_catalog(tmp_path, *request.param) as running:
        yield running


def attach(con, catalog, alias="lake"):
    """Attaches the catalog to a DuckDB connection the way docs/query.md tells users to."""
    import duckdb_offline

    if catalog.s3:
        duckdb_offline.create_s3_secret(con)
    con.sql(f"ATTACH 'wh' AS {alias} (TYPE iceberg, ENDPOINT '{catalog.uri}', AUTHORIZATION_TYPE 'none')")


@pytest.fixture
def duck(catalog):
    """A DuckDB connection (extensions loaded offline) with the catalog attached as `lake`."""
    import duckdb_offline

    con = duckdb_offline.connect()
    attach(con, catalog)
    yield con
    con.close()


def land_otlp(tmp_path: pathlib.Path, catalog: "Catalog", topics: dict, ends: dict, namespace: str) -> None:
    """Runs `floe run` on the Kafka `topics` (signal -> topic) into `namespace` of `catalog`
    until every partition's committed position reaches `ends` ("topic/partition" -> next
    offset), then stops it with SIGTERM and checks it exits cleanly. The positions are read
    from the dead-letter table's snapshot, which every checkpoint commits."""
    from pyiceberg.catalog import load_catalog

    job = tmp_path / f"{namespace}.toml"
    signals = ", ".join(f'"{t}" = "{s}"' for s, t in topics.items())
    job.write_text(
        f"""version = 1
name = "{namespace}"
[source.kafka]
brokers = "{BROKERS}"
topics = {list(topics.values())!r}
group_id = "floe-{namespace}-{uuid.uuid4().hex[:8]}"
signals = {{ {signals} }}
[catalog]
uri = "{catalog.uri}"
namespace = "{namespace}"
[checkpoint]
interval = "1s"
state_dir = "{tmp_path / ('state-' + namespace)}"
""".replace("'", '"')
    )
    process = subprocess.Popen([_binary("floe", "FLOE_BIN"), "run", str(job)], env=dict(os.environ, RUST_LOG="warn"))
    try:
        lake = load_catalog("lake", **catalog.pyiceberg_props())
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, "floe run exited early"
            try:
                summary = lake.load_table(f"{namespace}.floe_dead_letters").current_snapshot().summary
                positions = json.loads(summary["floe.positions"])
            except Exception:
                positions = {}
            if all(positions.get(partition) == str(end) for partition, end in ends.items()):
                break
            assert time.monotonic() < deadline, f"not caught up: {positions}"
            time.sleep(0.3)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    assert code == 0, f"floe run exited {code} on SIGTERM"
