"""Every engine reads the same rows: DuckDB (the reference), Trino, Spark and Iceberg Java read
the given tables through one REST catalog, and each table's rows must be the same multiset in
every engine.

    python tests/readers/compare.py --catalog URI [--warehouse NAME] [--trino URL [--metadata]]
        [--engines duckdb,trino,spark,java] NAMESPACE.TABLE...

Rows compare in one canonical form, driven by the table's Iceberg schema (read with PyIceberg):
integers, booleans and strings as themselves; doubles as doubles (floats rounded to 32 bits),
NaN and infinities by name; dates ISO; times and timestamps in µs (timestamp_ns in ns) since
midnight or the epoch, UTC; decimals as plain strings; UUIDs lower case; binary as hex; structs
by field name; lists in order; maps as [key, value] pairs sorted by key. Each engine's values
(Python objects from DuckDB and PySpark, Trino's JSON, the Java reader's canonical JSON) are
turned into that form by type, never by guessing from the value.

With `--metadata`, Trino's `$entries` and `$all_entries` tables of each table must list as many
manifest entries as PyIceberg finds in the same manifests (Trino 476 fails on entries whose
`sort_order_id` is null).

An engine that cannot read a kind of table at all (`cannot_read`: Spark and `time` columns) is
skipped for those tables only, and the line says so. Prints one JSON line per table (rows per
engine, skipped engines with the reason) and exits 1 with the first differences when
an engine disagrees or fails; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import decimal
import json
import math
import os
import pathlib
import struct
import subprocess
import sys
import time
from collections import Counter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "services" / "python"))

from pyiceberg import types as T  # noqa: E402

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
MICRO = dt.timedelta(microseconds=1)


# ---- the canonical form ------------------------------------------------------------------


def _micros(t: dt.datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return (t - EPOCH) // MICRO


def _time_micros(t: dt.time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


def _float(x, bits: int):
    if isinstance(x, str):  # NaN and infinities as names (Trino, Java)
        x = float(x)
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if bits == 32:
        x = struct.unpack("f", struct.pack("f", x))[0]
    return x


def _parse_trino_time(text: str) -> int:
    """Trino's `HH:MM:SS[.ffffff]` as µs since midnight."""
    hms, _, frac = text.partition(".")
    h, m, s = (int(p) for p in hms.split(":"))
    return ((h * 60 + m) * 60 + s) * 1_000_000 + int((frac + "000000")[:6])


def _parse_trino_timestamp(text: str, nanos: bool) -> int:
    """Trino's `YYYY-MM-DD HH:MM:SS[.fffffffff][ UTC]` as µs (or ns) since the epoch."""
    text = text.removesuffix(" UTC")
    day, _, clock = text.partition(" ")
    hms, _, frac = clock.partition(".")
    base = dt.datetime.fromisoformat(f"{day}T{hms}").replace(tzinfo=dt.timezone.utc)
    seconds = (base - EPOCH) // dt.timedelta(seconds=1)
    if nanos:
        return seconds * 1_000_000_000 + int((frac + "000000000")[:9])
    return seconds * 1_000_000 + int((frac + "000000")[:6])


def canonical(value, ty, engine: str):
    """`value` as `engine` returned it for Iceberg type `ty`, in the canonical form."""
    if value is None:
        return None
    if isinstance(ty, T.StructType):
        fields = ty.fields
        if isinstance(value, (list, tuple)) and not hasattr(value, "asDict"):
            value = dict(zip((f.name for f in fields), value))  # Trino's positional rows
        elif hasattr(value, "asDict"):
            value = value.asDict()
        return {f.name: canonical(value.get(f.name), f.field_type, engine) for f in fields}
    if isinstance(ty, T.ListType):
        return [canonical(v, ty.element_type, engine) for v in value]
    if isinstance(ty, T.MapType):
        if isinstance(value, dict):
            pairs = list(value.items())
        else:  # [[k, v], …] from the Java reader
            pairs = [tuple(p) for p in value]
        out = [[canonical(k, ty.key_type, engine), canonical(v, ty.value_type, engine)] for k, v in pairs]
        return sorted(out, key=lambda p: json.dumps(p[0], sort_keys=True))
    if isinstance(ty, (T.BooleanType,)):
        return bool(value)
    if isinstance(ty, (T.IntegerType, T.LongType)):
        return int(value)
    if isinstance(ty, T.FloatType):
        return _float(value, 32)
    if isinstance(ty, T.DoubleType):
        return _float(value, 64)
    if isinstance(ty, T.StringType):
        return str(value)
    if isinstance(ty, T.UUIDType):
        return str(value).lower()
    if isinstance(ty, T.DecimalType):
        return format(decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-ty.scale)), "f")
    if isinstance(ty, T.DateType):
        return value.isoformat() if isinstance(value, dt.date) else str(value)
    if isinstance(ty, T.TimeType):
        if isinstance(value, dt.time):
            return _time_micros(value)
        return _parse_trino_time(value) if engine == "trino" else int(value)
    if isinstance(ty, (T.TimestampType, T.TimestamptzType)):
        if isinstance(value, dt.datetime):
            return _micros(value)
        return _parse_trino_timestamp(value, False) if engine == "trino" else int(value)
    if isinstance(ty, (T.TimestampNanoType, T.TimestamptzNanoType)):
        if isinstance(value, dt.datetime):
            return _micros(value) * 1000
        return _parse_trino_timestamp(value, True) if engine == "trino" else int(value)
    if isinstance(ty, (T.BinaryType, T.FixedType)):
        if isinstance(value, str):
            return base64.b64decode(value).hex() if engine == "trino" else value.lower()
        return bytes(value).hex()
    raise TypeError(f"no canonical form for {ty}")


def rows_of(records, schema, engine: str) -> Counter:
    """The multiset of canonical rows (JSON strings) of `records`: mappings by column name."""
    out = Counter()
    for record in records:
        row = {f.name: canonical(record.get(f.name), f.field_type, engine) for f in schema.fields}
        out[json.dumps(row, sort_keys=True)] += 1
    return out


# ---- the engines -------------------------------------------------------------------------


def read_duckdb(args, tables, schemas):
    import duckdb_offline

    con = duckdb_offline.connect()
    con.sql(f"ATTACH '{args.warehouse}' AS lake (TYPE iceberg, ENDPOINT '{args.catalog}', AUTHORIZATION_TYPE 'none')")
    out = {}
    for table in tables:
        result = con.sql(f"SELECT * FROM lake.{table}")
        names = result.columns
        out[table] = rows_of((dict(zip(names, r)) for r in result.fetchall()), schemas[table], "duckdb")
    con.close()
    return out


def trino_query(url: str, sql: str):
    import requests

    # Without PARAMETRIC_DATETIME Trino rounds every timestamp to milliseconds for the client.
    headers = {"X-Trino-User": "floe", "X-Trino-Catalog": "lake", "X-Trino-Client-Capabilities": "PARAMETRIC_DATETIME"}
    response = requests.post(f"{url}/v1/statement", data=sql, headers=headers, timeout=120).json()
    columns, rows = None, []
    deadline = time.monotonic() + 90
    while True:
        # A Trino that has just started may not have registered itself as a worker yet.
        if "No nodes available" in response.get("error", {}).get("message", "") and time.monotonic() < deadline:
            time.sleep(1)
            response = requests.post(f"{url}/v1/statement", data=sql, headers=headers, timeout=120).json()
            continue
        if "error" in response:
            raise RuntimeError(f"trino: {response['error'].get('message')} ({sql})")
        columns = columns or response.get("columns")
        rows.extend(response.get("data", []))
        if "nextUri" not in response:
            return [c["name"] for c in columns or []], rows
        response = requests.get(response["nextUri"], headers=headers, timeout=120).json()


def read_trino(args, tables, schemas):
    out = {}
    for table in tables:
        names, rows = trino_query(args.trino, f"SELECT * FROM lake.{table}")
        out[table] = rows_of((dict(zip(names, r)) for r in rows), schemas[table], "trino")
    return out


def _has_time(ty) -> bool:
    if isinstance(ty, T.TimeType):
        return True
    if isinstance(ty, T.StructType):
        return any(_has_time(f.field_type) for f in ty.fields)
    if isinstance(ty, T.ListType):
        return _has_time(ty.element_type)
    if isinstance(ty, T.MapType):
        return _has_time(ty.key_type) or _has_time(ty.value_type)
    return False


def cannot_read(engine: str, schema) -> str | None:
    """Why `engine` cannot read a table of `schema` at all, if it cannot: Iceberg's Spark
    runtime (1.12) refuses a table with a `time` column ("Spark does not support time
    fields"), whatever the query selects."""
    if engine == "spark" and _has_time(schema.as_struct()):
        return "a time column (Iceberg's Spark runtime has no time type)"
    return None


def spark_session(catalog: str, warehouse: str):
    """A local Spark session with Iceberg's runtime (FLOE_SPARK_JARS) and the REST catalog at
    `catalog` as `lake`; timestamps in UTC."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", os.environ["FLOE_SPARK_JARS"])
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.lake", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.lake.type", "rest")
        .config("spark.sql.catalog.lake.uri", catalog)
        .config("spark.sql.catalog.lake.warehouse", warehouse)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def read_spark(args, tables, schemas):
    spark = spark_session(args.catalog, args.warehouse)
    try:
        out = {}
        for table in tables:
            if cannot_read("spark", schemas[table]):
                continue
            rows = spark.table(f"lake.{table}").collect()
            out[table] = rows_of((r.asDict() for r in rows), schemas[table], "spark")
        return out
    finally:
        spark.stop()


def read_java(args, tables, schemas):
    done = subprocess.run(
        ["java", "-cp", os.environ["FLOE_READERS_JAVA_CP"], "FloeRead", args.catalog, args.warehouse, *tables],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Iceberg Java reader failed:\n{done.stderr[-4000:]}")
    lines, table, out = {}, None, {}
    for line in done.stdout.splitlines():
        if line.startswith("#table "):
            table = line[len("#table "):]
            lines[table] = []
        elif line:
            lines[table].append(json.loads(line))
    for table in tables:
        out[table] = rows_of(lines.get(table, []), schemas[table], "java")
    return out


def _entries(table, snapshots) -> int:
    """Manifest entries (any status) in the distinct manifests of `snapshots`."""
    seen, count = set(), 0
    for snapshot in snapshots:
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path not in seen:
                seen.add(manifest.manifest_path)
                count += len(manifest.fetch_manifest_entry(table.io, discard_deleted=False))
    return count


def check_metadata(args, catalog, tables) -> list[str]:
    """Trino's `$entries` (the current snapshot's manifests) and `$all_entries` (every
    snapshot's) of each table against the entries PyIceberg finds in the same manifests; the
    problems found."""
    problems = []
    for table in tables:
        namespace, name = table.split(".", 1)
        loaded = catalog.load_table(table)
        current = [loaded.current_snapshot()] if loaded.current_snapshot() else []
        expected = (_entries(loaded, current), _entries(loaded, loaded.snapshots()))
        try:
            _, entries = trino_query(args.trino, f'SELECT count(*) FROM lake.{namespace}."{name}$entries"')
            _, everything = trino_query(args.trino, f'SELECT count(*) FROM lake.{namespace}."{name}$all_entries"')
        except RuntimeError as e:
            problems.append(f"{table}: {e}")
            continue
        if (entries[0][0], everything[0][0]) != expected:
            problems.append(
                f"{table}: Trino lists {entries[0][0]} entries and {everything[0][0]} in $all_entries, "
                f"the manifests hold {expected[0]} and {expected[1]}"
            )
    return problems


ENGINES = {"duckdb": read_duckdb, "trino": read_trino, "spark": read_spark, "java": read_java}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--warehouse", default="wh")
    parser.add_argument("--trino")
    parser.add_argument("--metadata", action="store_true")
    parser.add_argument("--engines", default="duckdb,trino,spark,java")
    parser.add_argument("tables", nargs="+")
    args = parser.parse_args()
    engines = args.engines.split(",")
    if engines[0] != "duckdb" or any(e not in ENGINES for e in engines):
        parser.error(f"--engines: duckdb first, then any of {sorted(ENGINES)}")
    if ("trino" in engines or args.metadata) and not args.trino:
        parser.error("--trino URL is needed to read with Trino")

    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("lake", type="rest", uri=args.catalog, warehouse=args.warehouse)
    schemas = {t: catalog.load_table(t).schema() for t in args.tables}
    read = {}
    for engine in engines:
        try:
            read[engine] = ENGINES[engine](args, args.tables, schemas)
        except Exception as e:  # an engine that cannot read is a failure, said plainly
            print(f"{engine} could not read: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    failed = False
    for table in args.tables:
        reference = read["duckdb"][table]
        skipped = {e: why for e in engines if (why := cannot_read(e, schemas[table]))}
        counts = {e: sum(read[e][table].values()) for e in engines if e not in skipped}
        print(json.dumps({"table": table, "rows": counts, "skipped": skipped}))
        for engine in engines[1:]:
            if engine in skipped:
                continue
            rows = read[engine][table]
            if rows != reference:
                failed = True
                missing, extra = reference - rows, rows - reference
                print(f"{table}: {engine} differs from duckdb: {sum(missing.values())} rows missing, "
                      f"{sum(extra.values())} extra", file=sys.stderr)
                for row in list(missing)[:3]:
                    print(f"  only in duckdb: {row}", file=sys.stderr)
                for row in list(extra)[:3]:
                    print(f"  only in {engine}: {row}", file=sys.stderr)
    if args.metadata:
        for problem in check_metadata(args, catalog, args.tables):
            failed = True
            print(f"metadata: {problem}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
