"""PyIceberg 0.12's RestCatalog against floe-catalog: namespaces, a partitioned table, appends,
scans, schema evolution, rename and drop with purge; DuckDB reads what PyIceberg wrote."""

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NamespaceNotEmptyError, NoSuchTableError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType


def events(ids, region):
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ts": pa.array([datetime(2026, 11, 1 + i % 3, 12, tzinfo=timezone.utc) for i in ids], pa.timestamp("us", tz="UTC")),
            "region": pa.array([region] * len(ids), pa.string()),
        },
        schema=pa.schema(
            [pa.field("id", pa.int64(), nullable=False), pa.field("ts", pa.timestamp("us", tz="UTC")), pa.field("region", pa.string())]
        ),
    )


def test_pyiceberg_full_cycle(catalog, duck):
    cat = load_catalog("floe", **{"type": "rest", **catalog.pyiceberg_props()})
    cat.create_namespace(("py",))
    cat.create_namespace(("py", "sales"), {"owner": "analytics"})
    assert ("py", "sales") in cat.list_namespaces(("py",))
    assert cat.load_namespace_properties(("py", "sales"))["owner"] == "analytics"

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ts", TimestamptzType(), required=False),
        NestedField(3, "region", StringType(), required=False),
        identifier_field_ids=[1],
    )
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"),
        PartitionField(source_id=3, field_id=1001, transform=IdentityTransform(), name="region"),
    )
    table = cat.create_table(("py", "sales", "events"), schema=schema, partition_spec=spec)
    table.append(events([1, 2, 3], "eu"))
    table.append(events([4, 5], "us"))
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4, 5]

    # Two writers from the same base: the second gets 409, reloads, retries, and both land.
    stale = cat.load_table(("py", "sales", "events"))
    table.append(events([6], "eu"))
    stale.append(events([99], "eu"))
    table = cat.load_table(("py", "sales", "events"))
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4, 5, 6, 99]

    with table.update_schema() as update:
        update.add_column("channel", StringType())
    table = cat.load_table(("py", "sales", "events"))
    with_channel = events([7], "ap").append_column("channel", pa.array(["web"], pa.string()))
    table.append(with_channel)
    scanned = table.scan().to_arrow()
    assert sorted(scanned["id"].to_pylist()) == [1, 2, 3, 4, 5, 6, 7, 99]
    assert sorted(c for c in scanned["channel"].to_pylist() if c) == ["web"]

    # DuckDB reads the table PyIceberg wrote, through the same catalog (DuckDB addresses
    # single-level namespaces by default, so the table is registered there too).
    cat.create_namespace(("shared",))
    cat.register_table(("shared", "events"), table.metadata_location)
    assert duck.sql("SELECT count(*), count(DISTINCT region), max(id) FROM lake.shared.events").fetchone() == (8, 3, 99)
    cat.drop_table(("shared", "events"))

    cat.rename_table(("py", "sales", "events"), ("py", "sales", "events_v2"))
    with pytest.raises(NoSuchTableError):
        cat.load_table(("py", "sales", "events"))
    renamed = cat.load_table(("py", "sales", "events_v2"))
    assert renamed.scan().to_arrow().num_rows == 8

    with pytest.raises(NamespaceNotEmptyError):
        cat.drop_namespace(("py", "sales"))
    metadata_file = renamed.metadata_location
    data_file = next(iter(renamed.scan().plan_files())).file.file_path
    assert catalog.exists(metadata_file) and catalog.exists(data_file)
    cat.purge_table(("py", "sales", "events_v2"))
    assert not catalog.exists(metadata_file), "purge left the metadata"
    assert not catalog.exists(data_file), "purge left the data"
    cat.drop_namespace(("py", "sales"))
    cat.drop_namespace(("py",))
    assert ("py",) not in cat.list_namespaces()
