"""The status page of `floe run` in a real browser: headless Chromium (FLOE_CHROMIUM, from
tests/tools/chromium) loads `/` of a job landing OTLP spans from Kafka, twice while data flows.
The numbers move on between the loads; the page makes the browser request nothing from any
other host (its NetLog lists every URL asked for on the page's behalf); a dead letter whose reason quotes HTML and script shows
as text, not as markup; a screenshot is kept (FLOE_ARTIFACTS_DIR, default
~/.cache/floe/artifacts). Then the catalog's pages (its tables; a table's snapshots) and a
maintenance daemon's page (its schedule; its runs) load the same way.

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


def catalog_and_maintenance_pages(tmp_path: pathlib.Path, catalog_uri: str, artifacts: pathlib.Path):
    """The catalog's pages (its tables, one table's snapshots) and a maintenance daemon's
    (its schedule, its runs), after the job committed to the catalog: each loaded in the
    browser; returns the (NetLog directory, URL) of every load."""
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
older_than = "1s"
retain_last = 1
"""
    )
    loads = []

    def browse(url: str, name: str) -> str:
        out = tmp_path / name
        out.mkdir()
        dom = chromium(url, out, "--dump-dom")
        chromium(url, tmp_path / name, f"--screenshot={artifacts / (name + '.png')}")
        loads.append((out, url))
        return dom

    home = browse(f"{catalog_uri}/", "catalog-page")
    assert "<title>floe-catalog" in home, home[-2000:]
    links = re.findall(r'<a href="(/tables/page/[^"]+)">(\w+)</a>', home)
    assert links, f"the catalog's page links the job's tables: {home[-3000:]}"
    href, name = links[0]
    table = browse(catalog_uri + href, "catalog-table-page")
    assert f"<title>page.{name}</title>" in table, table[-2000:]
    assert "(current)" in table and "append" in table, table[-3000:]
    missing = requests.get(f"{catalog_uri}/tables/page/no_such_table", timeout=10)
    assert missing.status_code == 404 and "NoSuchTableException" in missing.text, missing.text
    snapshots = re.search(r"<b>([\d,]+)</b>snapshots<", table)
    assert snapshots and int(snapshots.group(1).replace(",", "")) >= 2, table[-3000:]

    daemon = subprocess.Popen(
        [_binary("floe-maintenance", "FLOE_MAINTENANCE_BIN"), "--config", str(config)],
        env=dict(os.environ, RUST_LOG="warn"),
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        until_shown(url, lambda html: re.search(r"<td>page\.\w+</td><td>expire</td><td class=\"n\">[^<]+</td><td>ok</td>", html), daemon)
        dom = browse(url, "maintenance-page")
    finally:
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=60)
    assert code == 0, f"floe-maintenance exited {code} on SIGTERM"
    assert "<title>floe-maintenance" in dom, dom[-2000:]
    assert f"<td>page.{name}</td><td>expire</td><td>*/2 * * * * *</td>" in dom, dom[-3000:]
    assert re.search(r"<td>expire</td><td class=\"n\">[^<]+</td><td>ok</td>", dom), dom[-3000:]
    return loads


def test_the_status_page_in_a_browser(tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"page_spans_{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": BROKERS})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": BROKERS})

    def produce(payload: bytes) -> None:
        producer.produce(topic, payload, partition=0)
        producer.flush(30)

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
        try:
            produce(spans_request(0))
            # A record whose text quotes HTML and script: its dead letter's reason does too.
            produce(json.dumps({"resourceSpans": EVIL}).encode())

            def loaded(until) -> str:
                deadline = time.monotonic() + 60
                while True:
                    assert process.poll() is None, "floe run exited"
                    try:
                        html = requests.get(page, timeout=2).text
                        if until(html):
                            return html
                    except requests.ConnectionError:
                        pass
                    assert time.monotonic() < deadline, "the page never showed it"
                    time.sleep(0.3)

            loaded(lambda html: tile(html, "rows committed") >= 10 and tile(html, "dead letters") == 1)

            first = tmp_path / "first"
            first.mkdir()
            dom_before = chromium(page, first, "--dump-dom")
            for i in range(1, 6):
                produce(spans_request(i))
            loaded(lambda html: tile(html, "rows committed") >= 60)
            second = tmp_path / "second"
            second.mkdir()
            dom_after = chromium(page, second, "--dump-dom")
            artifacts = pathlib.Path(os.environ.get("FLOE_ARTIFACTS_DIR", pathlib.Path.home() / ".cache/floe/artifacts"))
            artifacts.mkdir(parents=True, exist_ok=True)
            shot = tmp_path / "shot"
            shot.mkdir()
            chromium(page, shot, f"--screenshot={artifacts / 'status-page.png'}")
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
        assert code == 0, f"floe run exited {code} on SIGTERM"
        other_pages = catalog_and_maintenance_pages(tmp_path, catalog.uri, artifacts)

    # The numbers moved on between the two loads, as the browser rendered them.
    rendered = [tile(dom, "rows committed") for dom in (dom_before, dom_after)]
    assert 10 <= rendered[0] < rendered[1], rendered
    # What the record said is shown as text, escaped: no element came from it.
    for dom in (dom_before, dom_after):
        assert "<title>floe run page</title>" in dom
        assert re.search(r"<b>(\d+ %|-)</b>writer busy<", dom), dom[-3000:]
        assert "&lt;script&gt;document.title=" in dom, dom[-3000:]
        assert "<script" not in dom and "<img" not in dom
    # The browser asked for nothing but the page.
    for run, url in [(first, page), (second, page), (shot, page), *other_pages]:
        urls = page_requests(run / "netlog.json", "http://127.0.0.1")
        assert url in urls, f"the NetLog holds the page's own request: {sorted(urls)}"
        assert urls == {url}, sorted(urls)
    assert (artifacts / "status-page.png").stat().st_size > 10_000
    print(f"screenshot: {artifacts / 'status-page.png'}")
