"""Spark's table maintenance beside Floe's writers, one round per line read on stdin:
`CALL lake.system.rewrite_data_files` (every file of at least two, deletes applied) and then
`CALL lake.system.expire_snapshots(retain_last => 1)` with a cutoff in the future — as hard as
expiry gets — on each table given.

    python tests/readers/spark_maintenance.py --catalog URI NAMESPACE.TABLE...

Prints `ready` once the Spark session is up, then for each line read one JSON line: the
round's files rewritten, snapshots expired and failures per table (a rewrite that lost a
race with a concurrent commit fails and is reported, as Spark reports it; that is not an
error of the test). Exits at end of input. Needs FLOE_SPARK_JARS (tests/readers/setup).
"""

from __future__ import annotations

import argparse
import json
import sys

from compare import spark_session


def one_round(spark, tables: list[str]) -> dict:
    """Rewrites then expires each table; what each did, or why it failed."""
    out = {}
    for table in tables:
        result = {}
        try:
            row = spark.sql(
                f"CALL lake.system.rewrite_data_files(table => '{table}', "
                "options => map('min-input-files', '2', 'delete-file-threshold', '1', 'rewrite-all', 'true'))"
            ).collect()[0]
            result["rewritten"] = row["rewritten_data_files_count"]
            result["added"] = row["added_data_files_count"]
        except Exception as e:  # a lost race with a commit: Spark's ValidationException
            result["rewrite_failed"] = str(e).splitlines()[0][:300]
        try:
            row = spark.sql(
                f"CALL lake.system.expire_snapshots(table => '{table}', "
                "older_than => TIMESTAMP '2100-01-01 00:00:00', retain_last => 1)"
            ).collect()[0]
            result["expired_data_files"] = row["deleted_data_files_count"]
        except Exception as e:
            result["expire_failed"] = str(e).splitlines()[0][:300]
        out[table] = result
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--warehouse", default="wh")
    parser.add_argument("tables", nargs="+")
    args = parser.parse_args()
    spark = spark_session(args.catalog, args.warehouse)
    print("ready", flush=True)
    try:
        for _ in sys.stdin:
            print(json.dumps(one_round(spark, args.tables)), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
