"""Smoke-check the services started by tests/services/up.

Run with the venv python after sourcing env.sh (tests/services/smoke does both).
Checks only the services listed in $FLOE_SERVICES. Prints one line per check and a
closing 'N passed, N failed' line; exits non-zero if any check failed.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
import traceback
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

SERVICES = set(filter(None, os.environ.get("FLOE_SERVICES", "").split(",")))


def check_pg() -> str:
    url = os.environ["FLOE_TEST_PG_URL"]
    psql = os.path.join(os.environ["FLOE_TEST_PG_BIN"], "psql")
    if not os.path.exists(psql):
        psql = "psql"
    sql = (
        "SHOW wal_level;"
        "CREATE TABLE IF NOT EXISTS floe_smoke(id int primary key);"
        "SELECT count(*) FROM pg_create_logical_replication_slot('floe_smoke', 'pgoutput');"
        "INSERT INTO floe_smoke VALUES (1);"
        "SELECT count(*) FROM pg_logical_slot_get_binary_changes('floe_smoke', NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'floe_smoke_pub');"
        "SELECT pg_drop_replication_slot('floe_smoke'); DROP TABLE floe_smoke;"
    )
    setup = "CREATE PUBLICATION floe_smoke_pub FOR ALL TABLES;"
    subprocess.run([psql, url, "-v", "ON_ERROR_STOP=1", "-qAtc", setup], check=True, capture_output=True)
    try:
        out = subprocess.run(
            [psql, url, "-v", "ON_ERROR_STOP=1", "-qAt"], input=sql, check=True,
            capture_output=True, text=True,
        ).stdout.split()
    finally:
        subprocess.run([psql, url, "-qAtc", "DROP PUBLICATION IF EXISTS floe_smoke_pub"], capture_output=True)
    assert out[0] == "logical", f"wal_level is {out[0]!r}"
    assert int(out[2]) >= 3, f"expected >= 3 pgoutput messages (B I C), got {out[2]}"
    return f"wal_level=logical, pgoutput slot returned {out[2]} messages"


def check_kafka() -> str:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    brokers = os.environ["FLOE_TEST_KAFKA_BROKERS"]
    topic = f"floe-smoke-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": brokers})
    for fut in admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)]).values():
        fut.result(30)
    producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})
    sent = {f"k{i}": f"v{i}" for i in range(10)}
    for k, v in sent.items():
        producer.produce(topic, key=k, value=v)
    assert producer.flush(30) == 0, "producer did not flush"
    consumer = Consumer({
        "bootstrap.servers": brokers, "group.id": topic, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
    })
    got = {}
    t0 = time.monotonic()
    try:
        consumer.subscribe([topic])
        while len(got) < len(sent) and time.monotonic() - t0 < 60:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise RuntimeError(msg.error())
            got[msg.key().decode()] = msg.value().decode()
        if got:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert got == sent, f"consumed {len(got)} of {len(sent)} records"
    admin.delete_topics([topic])
    return f"produced and consumed {len(got)} records via group {topic} in {time.monotonic() - t0:.1f} s"


def check_s3() -> str:
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["FLOE_TEST_S3_ENDPOINT"])
    bucket = os.environ["FLOE_TEST_S3_BUCKET"]
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert bucket in names, f"bucket {bucket} missing: {names}"
    s3.put_object(Bucket=bucket, Key="smoke/hello.txt", Body=b"hello")
    body = s3.get_object(Bucket=bucket, Key="smoke/hello.txt")["Body"].read()
    assert body == b"hello"
    s3.delete_object(Bucket=bucket, Key="smoke/hello.txt")
    return f"buckets {names}; put/get ok"


def check_duckdb() -> str:
    import duckdb_offline

    t0 = time.monotonic()
    con = duckdb_offline.connect()
    load_s = time.monotonic() - t0
    loaded = sorted(r[0] for r in con.execute(
        "SELECT extension_name FROM duckdb_extensions() WHERE loaded AND extension_name IN ('avro','httpfs','iceberg')"
    ).fetchall())
    assert loaded == ["avro", "httpfs", "iceberg"], loaded
    extra = ""
    if "s3" in SERVICES:
        duckdb_offline.create_s3_secret(con)
        path = f"s3://{os.environ['FLOE_TEST_S3_BUCKET']}/smoke/duckdb.parquet"
        con.execute(f"COPY (SELECT range AS x FROM range(100)) TO '{path}' (FORMAT parquet)")
        total = con.execute(f"SELECT sum(x) FROM read_parquet('{path}')").fetchone()[0]
        assert total == 4950, total
        extra = "; parquet round trip through moto via httpfs ok"
    return f"duckdb {duckdb_offline.duckdb_version()} loaded {loaded} offline in {load_s:.2f} s{extra}"


CHECKS = [("pg", check_pg), ("kafka", check_kafka), ("s3", check_s3), ("python", check_duckdb)]


def main() -> int:
    passed = failed = 0
    for service, fn in CHECKS:
        if service not in SERVICES:
            continue
        t0 = time.monotonic()
        try:
            detail = fn()
            passed += 1
            print(f"ok   {service}: {detail} [{time.monotonic() - t0:.1f} s]", flush=True)
        except Exception:  # noqa: BLE001 - report every failure
            failed += 1
            print(f"FAIL {service}:", flush=True)
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
