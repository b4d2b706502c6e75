"""DuckDB with the avro, httpfs and iceberg extensions, loaded offline.

The extensions come from the PyPI wheels ``duckdb-extension-{avro,httpfs,iceberg}``
(pinned in tests/services/requirements.txt). Each wheel ships
``duckdb_extension_<name>/extensions/v<duckdb version>/<name>.duckdb_extension``;
we ``LOAD`` those files by path, so nothing is downloaded and nothing is written
to ``~/.duckdb``. Autoinstall is disabled, so a query that would need another
extension fails instead of reaching for the network.

Usage::

    import duckdb_offline
    con = duckdb_offline.connect()
    con.sql("SELECT * FROM iceberg_scan('file:///.../metadata/00002-....metadata.json')")

    # S3 (moto) through httpfs, using the env exported by tests/services/up:
    duckdb_offline.create_s3_secret(con)
"""

from __future__ import annotations

import importlib
import os
import pathlib
from typing import Iterable, Mapping, Optional

import duckdb

# Order matters: iceberg needs avro already loaded, or it tries to autoinstall it.
DEFAULT_EXTENSIONS = ("avro", "httpfs", "iceberg")


def duckdb_version() -> str:
    """The running DuckDB version as used in extension paths, e.g. ``v1.5.5``."""
    return duckdb.sql("PRAGMA version").fetchone()[0]


def extension_path(name: str) -> pathlib.Path:
    """Path of the ``.duckdb_extension`` file shipped by ``duckdb-extension-<name>``."""
    try:
        module = importlib.import_module(f"duckdb_extension_{name}")
    except ImportError as exc:  # pragma: no cover - depends on the venv
        raise RuntimeError(
            f"DuckDB extension wheel for {name!r} is not installed "
            f"(pip install duckdb-extension-{name}=={duckdb.__version__})"
        ) from exc
    version = duckdb_version()
    path = pathlib.Path(module.__file__).parent / "extensions" / version / f"{name}.duckdb_extension"
    if not path.is_file():
        raise RuntimeError(
            f"{path} not found: the duckdb-extension-{name} wheel does not match duckdb {version}"
        )
    return path


def connect(
    database: str = ":memory:",
    *,
    read_only: bool = False,
    config: Optional[Mapping[str, object]] = None,
    extensions: Iterable[str] = DEFAULT_EXTENSIONS,
) -> "duckdb.DuckDBPyConnection":
    """Open a DuckDB connection with ``extensions`` LOADed from the wheel files.

    ``config`` is merged over ``{"autoinstall_known_extensions": False}``; pass it to
    set e.g. ``extension_directory`` or ``threads``.
    """
    cfg = {"autoinstall_known_extensions": False}
    if config:
        cfg.update(config)
    con = duckdb.connect(database, read_only=read_only, config=cfg)
    try:
        for name in extensions:
            path = str(extension_path(name)).replace("'", "''")
            con.execute(f"LOAD '{path}'")
        # No progress bar: it would land in the output the tests parse.
        con.execute("SET enable_progress_bar = false")
    except Exception:
        con.close()
        raise
    return con


def create_s3_secret(
    con: "duckdb.DuckDBPyConnection",
    name: str = "floe_test_s3",
    *,
    endpoint: Optional[str] = None,
) -> None:
    """Create a DuckDB S3 secret for the moto server started by tests/services/up.

    Reads FLOE_TEST_S3_ENDPOINT (``http://127.0.0.1:PORT``), AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY and AWS_REGION. Path-style addressing, no TLS.
    """
    endpoint = endpoint or os.environ["FLOE_TEST_S3_ENDPOINT"]
    use_ssl = endpoint.startswith("https://")
    host = endpoint.split("://", 1)[-1].rstrip("/")

    def q(value: str) -> str:
        return "'" + value.replace("'", "''") + "'"

    con.execute(
        f"CREATE OR REPLACE SECRET {name} (TYPE s3, "
        f"KEY_ID {q(os.environ.get('AWS_ACCESS_KEY_ID', 'test'))}, "
        f"SECRET {q(os.environ.get('AWS_SECRET_ACCESS_KEY', 'test'))}, "
        f"REGION {q(os.environ.get('AWS_REGION', 'us-east-1'))}, "
        f"ENDPOINT {q(host)}, URL_STYLE 'path', USE_SSL {str(use_ssl).lower()})"
    )


__all__ = ["DEFAULT_EXTENSIONS", "connect", "create_s3_secret", "duckdb_version", "extension_path"]
