"""DuckDB 1.5.5 attached to floe-catalog: DDL, every kind of write, and multi-table transactions,
read back by DuckDB and cross-checked through the catalog with PyIceberg."""

import duckdb
import duckdb_offline
import pytest
from conftest import attach
from pyiceberg.catalog import load_catalog


def rows(con, sql):
    return sorted(con.sql(sql).fetchall())


def test_create_insert_update_delete_merge(duck, catalog):
    duck.sql("CREATE SCHEMA lake.shop")
    duck.sql("CREATE TABLE lake.shop.orders (id BIGINT, customer VARCHAR, amount DOUBLE)")
    duck.sql("INSERT INTO lake.shop.orders VALUES (1, 'ada', 10.0), (2, 'bob', 20.0), (3, 'cy', 30.0)")
    assert rows(duck, "SELECT * FROM lake.shop.orders") == [(1, "ada", 10.0), (2, "bob", 20.0), (3, "cy", 30.0)]

    duck.sql("UPDATE lake.shop.orders SET amount = amount * 2 WHERE id = 2")
    duck.sql("DELETE FROM lake.shop.orders WHERE id = 3")
    assert rows(duck, "SELECT * FROM lake.shop.orders") == [(1, "ada", 10.0), (2, "bob", 40.0)]

    duck.sql("CREATE TABLE lake.shop.changes (id BIGINT, customer VARCHAR, amount DOUBLE)")
    duck.sql("INSERT INTO lake.shop.changes VALUES (1, 'ada', 11.0), (4, 'dee', 44.0)")
    duck.sql(
        """
        MERGE INTO lake.shop.orders AS o USING lake.shop.changes AS c ON o.id = c.id
        WHEN MATCHED THEN UPDATE SET amount = c.amount
        WHEN NOT MATCHED THEN INSERT VALUES (c.id, c.customer, c.amount)
        """
    )
    expected = [(1, "ada", 11.0), (2, "bob", 40.0), (4, "dee", 44.0)]
    assert rows(duck, "SELECT * FROM lake.shop.orders") == expected

    # A fresh connection sees the same committed state (nothing lives only in DuckDB's cache).
    fresh = duckdb_offline.connect()
    attach(fresh, catalog, "again")
    assert rows(fresh, "SELECT * FROM again.shop.orders") == expected

    # The table's history is visible to other clients: PyIceberg lists its snapshots.
    cat = load_catalog("floe", **{"type": "rest", **catalog.pyiceberg_props()})
    table = cat.load_table(("shop", "orders"))
    assert len(table.metadata.snapshots) >= 4


def test_two_table_transaction_is_atomic(duck, catalog):
    duck.sql("CREATE SCHEMA lake.bank")
    duck.sql("CREATE TABLE lake.bank.accounts (id INTEGER, balance BIGINT)")
    duck.sql("CREATE TABLE lake.bank.ledger (account INTEGER, delta BIGINT)")
    duck.sql("INSERT INTO lake.bank.accounts VALUES (1, 100), (2, 0)")

    duck.sql("BEGIN")
    duck.sql("UPDATE lake.bank.accounts SET balance = balance - 30 WHERE id = 1")
    duck.sql("UPDATE lake.bank.accounts SET balance = balance + 30 WHERE id = 2")
    duck.sql("INSERT INTO lake.bank.ledger VALUES (1, -30), (2, 30)")
    duck.sql("COMMIT")
    assert rows(duck, "SELECT * FROM lake.bank.accounts") == [(1, 70), (2, 30)]
    assert rows(duck, "SELECT * FROM lake.bank.ledger") == [(1, -30), (2, 30)]

    # A rolled-back transaction leaves both tables as they were.
    duck.sql("BEGIN")
    duck.sql("INSERT INTO lake.bank.ledger VALUES (9, 9)")
    duck.sql("DELETE FROM lake.bank.accounts")
    duck.sql("ROLLBACK")
    assert rows(duck, "SELECT * FROM lake.bank.accounts") == [(1, 70), (2, 30)]
    assert rows(duck, "SELECT count(*) FROM lake.bank.ledger") == [(2,)]


def test_drop_table_and_schema(duck):
    duck.sql("CREATE SCHEMA lake.tmp")
    duck.sql("CREATE TABLE lake.tmp.t (x INTEGER)")
    duck.sql("INSERT INTO lake.tmp.t VALUES (1)")
    duck.sql("DROP TABLE lake.tmp.t")
    with pytest.raises(duckdb.Error):
        duck.sql("SELECT * FROM lake.tmp.t").fetchall()
    duck.sql("DROP SCHEMA lake.tmp")
    names = [r[0] for r in duck.sql("SELECT schema_name FROM duckdb_schemas() WHERE database_name = 'lake'").fetchall()]
    assert "tmp" not in names
