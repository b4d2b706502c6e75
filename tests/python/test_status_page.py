"""The status pages in a real browser: headless Chromium (FLOE_CHROMIUM, from
tests/tools/chromium) loads, twice while a job lands OTLP spans from Kafka, the job's page,
the catalog's table page and a maintenance daemon's page (and the catalog's table list once).
The numbers move on between the loads (rows committed, snapshots, runs); no page makes the
browser request anything but itself (its NetLog lists every URL asked for on the page's
behalf); a dead letter whose reason quotes HTML and script, and a table property that does,
show as text, not as markup; a screenshot of each page is kept (FLOE_ARTIFACTS_DIR, default
~/.cache/floe/artifacts).

Needs FLOE_TEST_KAFKA_BROKERS.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import time
import uuid

import pytest
import requests
from conftest import BROKERS, REQUIRED, _binary, _free_port, start_catalog

if REQUIRED:
    assert BROKERS, "FLOE_REQUIRE_SERVICES=1 needs FLOE_TEST_KAFKA_BROKERS"
pytestmark = pytest.mark.skipif(not BROKERS, reason="FLOE_TEST_KAFKA_BROKERS is not set")

EVIL = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"


def spans_request(i: int) -> bytes:
    """One OTLP/JSON traces request with ten spans."""
    start = 1_767_225_600_000_000_000 + i * 1_000_000_000
    spans = [
        {
            "traceId": f"{i:016x}{j:016x}",
            "spanId": f"{i:08x}{j:08x}",
            "name": "GET /items",
            "kind": 2,
            "startTimeUnixNano": str(start + j),
            "endTimeUnixNano": str(start + j + 5_000_000),
        }
        for j in range(10)
    ]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "shop"}}]}
    body = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}
    return json.dumps(body).encode()


def tile(html: str, name: str) -> int:
    """The number on the page's tile `name` (0 before it shows)."""
    found = re.search(r"<b>([\d,]+)</b>" + re.escape(name) + "<", html)
    return int(found.group(1).replace(",", "")) if found else 0


def chromium(url: str, out: pathlib.Path, *extra: str) -> str:
    """Loads `url` in headless Chromium, recording its NetLog; returns what it printed."""
    browser = os.environ.get("FLOE_CHROMIUM")
    assert browser, "FLOE_CHROMIUM is unset: FLOE_CHROMIUM=$(tests/tools/chromium)"
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            f"--user-data-dir={out / 'profile'}",
            f"--log-net-log={out / 'netlog.json'}",
            "--window-size=1280,1600",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def page_requests(netlog: pathlib.Path, site: str) -> set[str]:
    """Every URL requested on behalf of a page of `site`: the NetLog's URL requests whose
    network isolation key's top frame is that site — whatever host they go to. (The
    browser's own requests, to its update and account services, carry other keys.)"""
    log = json.loads(netlog.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = set()
    for event in log.get("events", []):
        params = event.get("params") or {}
        if event["type"] == start_job and params.get("network_isolation_key", "").split(" ")[0] == site:
            urls.add(params["url"])
    return urls


def until_shown(url: str, shows, process: subprocess.Popen | None = None) -> str:
    """`url`'s HTML once `shows(html)` holds (within 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        assert process is None or process.poll() is None, f"the process serving {url} exited"
        try:
            html = requests.get(url, timeout=2).text
            if shows(html):
                return html
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, f"{url} never showed it"
        time.sleep(0.3)


class Browser:
    """Loads pages in headless Chromium, one NetLog per load; keeps screenshots."""

    def __init__(self, tmp_path: pathlib.Path):
        self.tmp_path = tmp_path
        self.loads: list[tuple[pathlib.Path, str]] = []
        self.artifacts = pathlib.Path(os.environ.get("FLOE_ARTIFACTS_DIR", pathlib.Path.home() / ".cache/floe/artifacts"))
        self.artifacts.mkdir(parents=True, exist_ok=True)

    def dom(self, url: str, name: str) -> str:
        """The DOM as the browser rendered `url`."""
        out = self.tmp_path / name
        out.mkdir()
        self.loads.append((out, url))
        return chromium(url, out, "--dump-dom")

    def screenshot(self, url: str, name: str) -> pathlib.Path:
        out = self.tmp_path / f"{name}-shot"
        out.mkdir()
        self.loads.append((out, url))
        shot = self.artifacts / f"{name}.png"
        chromium(url, out, f"--screenshot={shot}")
        assert shot.stat().st_size > 10_000
        return shot

    def assert_only_own_requests(self) -> None:
        for run, url in self.loads:
            urls = page_requests(run / "netlog.json", "http://127.0.0.1")
            assert url in urls, f"the NetLog holds the page's own request: {sorted(urls)}"
            assert urls == {url}, sorted(urls)


def start_maintenance(tmp_path: pathlib.Path, catalog_uri: str) -> tuple[subprocess.Popen, str]:
    """A maintenance daemon expiring (nothing: snapshots older than an hour) every table of
    the job every 2 s; its page's URL."""
    port = _free_port()
    config = tmp_path / "maintenance.toml"
    config.write_text(
        f"""version = 1
[daemon]
metrics_listen = "127.0.0.1:{port}"
discover_every = "1s"
[catalog]
uri = "{catalog_uri}"
[[policy]]
tables = "page.*"
[policy.expire]
schedule = "*/2 * * * * *"
older_than = "1h"
retain_last = 1
"""
    )
    daemon = subprocess.Popen(
        [_binary("floe-maintenance", "FLOE_MAINTENANCE_BIN"), "--config", str(config)],
        env=dict(os.environ, RUST_LOG="warn"),
    )
    return daemon, f"http://127.0.0.1:{port}/"


def set_table_property(catalog, table: str, key: str, value: str) -> None:
    """Sets a table property through the REST API, as any client may."""
    url = f"{catalog.uri}/v1/{catalog.name}/namespaces/page/tables/{table}"
    body = {"requirements": [], "updates": [{"action": "set-properties", "updates": {key: value}}]}
    answer = requests.post(url, json=body, timeout=30)
    assert answer.ok, answer.text


def test_the_status_pages_in_a_browser(tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"page_spans_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": BROKERS})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": BROKERS})

    def produce(payload: bytes) -> None:
        producer.produce(topic, payload, partition=0)
        producer.flush(30)

    browser = Browser(tmp_path)
    port = _free_port()
    with start_catalog(tmp_path, "sqlite", "file") as catalog:
        job = tmp_path / "page.toml"
        job.write_text(
            f"""version = 1
name = "page"
[source.kafka]
brokers = "{BROKERS}"
topics = ["{topic}"]
group_id = "floe-page-{uuid.uuid4().hex[:8]}"
signals = {{ "{topic}" = "traces" }}
[catalog]
uri = "{catalog.uri}"
namespace = "page"
[checkpoint]
interval = "1s"
state_dir = "{tmp_path / 'state'}"
[metrics]
listen = "127.0.0.1:{port}"
"""
        )
        process = subprocess.Popen([_binary("floe", "FLOE_BIN"), "run", str(job)], env=dict(os.environ, RUST_LOG="warn"))
        page = f"http://127.0.0.1:{port}/"
        spans_page = f"{catalog.uri}/tables/page/otel_spans"
        daemon = None
        try:
            produce(spans_request(0))
            # A record whose text quotes HTML and script: its dead letter's reason does too.
            produce(json.dumps({"resourceSpans": EVIL}).encode())
            until_shown(page, lambda html: tile(html, "rows committed") >= 10 and tile(html, "dead letters") == 1, process)
            # A table property quoting HTML and script, set as any REST client may.
            set_table_property(catalog, "otel_logs", "note", EVIL)
            daemon, maintenance = start_maintenance(tmp_path, catalog.uri)
            until_shown(maintenance, lambda html: tile(html, "runs") >= 1, daemon)

            first = {
                "job": browser.dom(page, "job-1"),
                "table": browser.dom(spans_page, "table-1"),
                "maintenance": browser.dom(maintenance, "maintenance-1"),
            }
            for i in range(1, 6):
                produce(spans_request(i))
            until_shown(page, lambda html: tile(html, "rows committed") >= 60, process)
            until_shown(spans_page, lambda html: tile(html, "snapshots") > tile(first["table"], "snapshots"))
            until_shown(maintenance, lambda html: tile(html, "runs") > tile(first["maintenance"], "runs"), daemon)
            second = {
                "job": browser.dom(page, "job-2"),
                "table": browser.dom(spans_page, "table-2"),
                "maintenance": browser.dom(maintenance, "maintenance-2"),
            }
            home = browser.dom(f"{catalog.uri}/", "catalog")
            logs_table = browser.dom(f"{catalog.uri}/tables/page/otel_logs", "logs-table")
            missing = requests.get(f"{catalog.uri}/tables/page/no_such_table", timeout=10)
            shots = [
                browser.screenshot(page, "status-page"),
                browser.screenshot(f"{catalog.uri}/", "catalog-page"),
                browser.screenshot(spans_page, "catalog-table-page"),
                browser.screenshot(maintenance, "maintenance-page"),
            ]
        finally:
            if daemon is not None:
                daemon.send_signal(signal.SIGTERM)
                assert daemon.wait(timeout=60) == 0, "floe-maintenance did not stop cleanly on SIGTERM"
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
        assert code == 0, f"floe run exited {code} on SIGTERM"

    # The numbers moved on between the two loads, as the browser rendered them.
    for name, what in (("job", "rows committed"), ("table", "snapshots"), ("maintenance", "runs")):
        before, after = tile(first[name], what), tile(second[name], what)
        assert 0 < before < after, f"{name} page, {what}: {before} then {after}"
    assert tile(first["job"], "rows committed") >= 10
    # What the record and the property said is shown as text, escaped: no element came from it.
    for dom in (first["job"], second["job"], logs_table):
        assert "&lt;script&gt;document.title=" in dom, dom[-3000:]
    for dom in (*first.values(), *second.values(), home, logs_table):
        assert "<script" not in dom and "<img" not in dom, dom[-3000:]
    # What each page shows.
    assert "<title>floe run page</title>" in first["job"]
    assert re.search(r"<b>(\d+ %|-)</b>writer busy<", second["job"]), second["job"][-3000:]
    assert re.search(r'<a href="/tables/page/otel_spans">otel_spans</a>', home), home[-3000:]
    assert "<title>page.otel_spans</title>" in second["table"]
    assert "(current)" in second["table"] and "append" in second["table"]
    assert tile(second["table"], "rows") >= 60, "the snapshot's total-records, as the page shows it"
    assert "floe-checkpoint.page." in second["table"], "the job's checkpoint tag is listed"
    assert missing.status_code == 404 and "NoSuchTableException" in missing.text, missing.text
    assert "<title>floe-maintenance" in second["maintenance"]
    assert "<td>page.otel_spans</td><td>expire</td><td>*/2 * * * * *</td>" in second["maintenance"]
    assert re.search(r"<td>expire</td><td class=\"n\">[^<]+</td><td>ok</td>", second["maintenance"])
    # The browser asked for nothing but each page itself.
    browser.assert_only_own_requests()
    print("screenshots:", *shots)
