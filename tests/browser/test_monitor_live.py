"""`locus monitor live` end to end: the real command, the real sensors, the page in headless
Chromium. What a user does: watch the plot grow, label a phase from a script (the FIFO) and
from the page, change the interval for every client, pause and resume, zoom and reset, toggle
and group traces, load a recorded file (also with no server at all), and the token when the
server listens beyond loopback.
"""

from __future__ import annotations

import functools
import http.server
import json
import statistics
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIVE = "#status[data-state='live']"


def points(page) -> int:
    return int(page.get_attribute("#plots", "data-points"))


def wait_points(page, more_than: int, timeout_ms: int = 15_000) -> int:
    page.wait_for_function(
        "n => +document.querySelector('#plots').dataset.points > n",
        arg=more_than,
        timeout=timeout_ms,
    )
    return points(page)


def last_spacings(page, k: int) -> list[float]:
    return page.evaluate(
        """k => { const t = window.locus.monitor.samples.times.slice(-(k + 1));
                  return t.slice(1).map((x, i) => x - t[i]); }""",
        k,
    )


def http_status(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {})) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_plot_updates_and_fifo_label(start_live, open_page):
    srv = start_live("--interval", "100ms")
    assert "token=" not in srv.url  # loopback: no token
    page = open_page(srv.url)
    page.wait_for_selector(LIVE)
    page.wait_for_selector(".chart")  # default events chosen and plotted
    n = points(page)
    assert wait_points(page, n + 10) > n + 10
    assert page.get_attribute("#interval-current", "data-ms") == "100"

    srv.control("label hello-fifo")
    mark = page.locator(".label-mark[data-text='hello-fifo']").first
    mark.wait_for(state="visible")
    assert "hello-fifo" in mark.inner_text()


def test_events_chosen_in_the_address(start_live, open_page):
    srv = start_live()
    page = open_page(srv.url + "?events=vmstat::numa_miss,cpu:*:user")
    page.wait_for_selector(LIVE)
    page.wait_for_selector(".chart")
    labels = page.locator(".chart .u-legend .u-series .u-label").all_inner_texts()
    labels = sorted(x for x in labels if x != "time")
    assert len(labels) == 2 and labels[1] == "vmstat::numa_miss", labels
    assert labels[0].startswith("cpu:user (mean of "), labels


def test_interval_for_all_clients(start_live, open_page):
    srv = start_live("--interval", "100ms")
    page = open_page(srv.url)
    page.wait_for_selector(LIVE)
    wait_points(page, 8)
    # Medians: on a loaded machine one tick may come late and the next one early.
    before = last_spacings(page, 6)
    assert 0.07 < statistics.median(before) < 0.15, before

    page.fill("#interval-input", "300")
    page.click("#interval-apply")
    page.wait_for_selector("#interval-current[data-ms='300']")
    n = points(page)
    wait_points(page, n + 6)
    after = last_spacings(page, 5)
    assert 0.25 < statistics.median(after) < 0.4, after

    other = open_page(srv.url)  # a client that joins later sees the new interval too
    other.wait_for_selector(LIVE)
    other.wait_for_selector("#interval-current[data-ms='300']")


def test_label_pause_resume_from_page(start_live, open_page):
    srv = start_live("--interval", "100ms")
    page = open_page(srv.url)
    page.wait_for_selector(LIVE)
    wait_points(page, 3)

    page.fill("#label-input", "phase two")
    page.click("#label-send")
    page.locator(".label-mark[data-text='phase two']").first.wait_for(state="visible")

    page.click("#pause")
    page.wait_for_selector("#resume:not([disabled])")
    page.locator(".label-mark[data-text='paused']").first.wait_for(state="attached")
    page.wait_for_timeout(400)  # a batch in flight may still land
    n = points(page)
    page.wait_for_timeout(600)
    assert points(page) == n, "samples kept coming while paused"

    page.click("#resume")
    page.wait_for_selector("#pause:not([disabled])")
    wait_points(page, n + 3)


def test_zoom_reset_legend_and_grouping(start_live, open_page):
    srv = start_live("--interval", "50ms")
    page = open_page(srv.url)
    page.wait_for_selector(LIVE)
    wait_points(page, 40)
    over = page.locator(".chart .u-over").first
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=5)
    page.mouse.up()
    assert not page.is_checked("#follow-toggle")  # a zoomed window stops following
    # uPlot applies the selected window on the next frame: read it once it is drawn.
    page.wait_for_timeout(200)
    lo, hi = page.evaluate("window.locus.monitor.plots.visibleRange()")
    page.wait_for_timeout(500)
    assert page.evaluate("window.locus.monitor.plots.visibleRange()") == [lo, hi]

    over.dblclick()
    assert page.is_checked("#follow-toggle")

    # Hover: the legend shows the exact values under the cursor.
    page.mouse.move(box["x"] + box["width"] * 0.5, y)
    value = page.locator(".chart").first.locator(".u-legend .u-series").nth(1)
    assert value.locator(".u-value").inner_text() not in ("", "—")

    # Legend click hides a trace.
    value.locator(".u-label").click()
    assert "u-off" in value.get_attribute("class")

    # Grouped (one trace per sensor:event) vs each source apart.
    grouped = page.locator(".chart .u-legend .u-series").count()
    page.uncheck("#group-toggle")
    page.wait_for_function(
        "n => document.querySelectorAll('.chart .u-legend .u-series').length > n", arg=grouped
    )


def write_recording(path: Path) -> None:
    t0 = 1_700_000_000.0
    events = [
        {
            "id": "net:eth0:rx_bytes",
            "sensor": "net",
            "source": "eth0",
            "event": "rx_bytes",
            "unit": "B/s",
            "kind": "counter",
            "description": "bytes received",
        },
        {
            "id": "net:eth1:rx_bytes",
            "sensor": "net",
            "source": "eth1",
            "event": "rx_bytes",
            "unit": "B/s",
            "kind": "counter",
            "description": "bytes received",
        },
        {
            "id": "disk::reads",
            "sensor": "disk",
            "source": "",
            "event": "reads",
            "unit": "reads/s",
            "kind": "counter",
            "description": "reads completed",
        },
    ]
    recs = [
        {
            "format": "locus-monitor",
            "version": 1,
            "start": t0,
            "interval_ms": 500,
            "host": {"hostname": "rec"},
            "events": events,
        }
    ]
    for i in range(20):
        t = t0 + 0.5 * (i + 1)
        recs.append(
            {
                "t": t,
                "dt": 0.5,
                "v": {
                    "net:eth0:rx_bytes": 100.0 * i,
                    "net:eth1:rx_bytes": 5.0,
                    "disk::reads": 42.0,
                },
            }
        )
        if i == 9:
            recs.append({"t": t + 0.1, "label": "phase-2"})
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def check_loaded_file(page, path: Path) -> None:
    page.set_input_files("#file-input", str(path))
    page.wait_for_selector("#status[data-state='file']")
    page.wait_for_function("document.querySelector('#plots').dataset.points === '20'")
    legend = page.locator(".chart .u-legend").all_inner_texts()
    text = " ".join(legend)
    assert "net:rx_bytes (sum of 2)" in text and "disk::reads" in text, text
    page.locator(".label-mark[data-text='phase-2']").first.wait_for(state="visible")
    # Hovering the middle shows the exact constant value of disk::reads.
    chart = page.locator(".chart[data-unit='reads/s']")
    box = chart.locator(".u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    assert chart.locator(".u-legend .u-series").nth(1).locator(".u-value").inner_text() == "42"
    # Sources apart: both interfaces as their own traces.
    page.uncheck("#group-toggle")
    page.wait_for_function(
        "[...document.querySelectorAll('.chart .u-legend')].some("
        "l => l.textContent.includes('net:eth1:rx_bytes'))"
    )


def test_load_recorded_file(start_live, open_page, tmp_path):
    rec = tmp_path / "run.jsonl"
    write_recording(rec)
    srv = start_live("--interval", "100ms")
    page = open_page(srv.url)
    page.wait_for_selector(LIVE)
    check_loaded_file(page, rec)
    assert page.is_visible("#live-button")
    page.click("#live-button")
    page.wait_for_selector(LIVE)


def test_load_file_recorded_by_locus(start_live, open_page, locus_cmd, tmp_path):
    out = tmp_path / "mon.jsonl"
    argv, env = locus_cmd
    proc = subprocess.run(
        [*argv, "monitor", "record", "-o", str(out), "--interval", "50ms", "--", "sleep", "1"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    nsamples = sum(1 for r in lines if "v" in r)
    assert lines[0]["format"] == "locus-monitor" and nsamples >= 5
    srv = start_live("--interval", "100ms")
    page = open_page(srv.url)
    page.set_input_files("#file-input", str(out))
    page.wait_for_selector("#status[data-state='file']")
    page.wait_for_function(
        "n => document.querySelector('#plots').dataset.points === String(n)", arg=nsamples
    )
    page.wait_for_selector(".chart")


@pytest.fixture
def static_web():
    """web/ from a plain static HTTP server: the page with no websocket behind it."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(REPO / "web"))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_offline_page_loads_file(static_web, open_page, tmp_path):
    rec = tmp_path / "run.jsonl"
    write_recording(rec)
    page = open_page(static_web, ignore=("WebSocket", "404"))
    check_loaded_file(page, rec)


def test_token_required_off_loopback(start_live, open_page):
    srv = start_live("--bind", "0.0.0.0", "--interval", "100ms")
    assert "?token=" in srv.url, srv.url
    token = srv.url.split("?token=")[1]
    base = srv.url.split("?")[0].replace("0.0.0.0", "127.0.0.1")
    assert http_status(base) == 403
    assert http_status(base + "monitor/app.js") == 403
    assert http_status(base + "ws") == 403
    assert http_status(base + "?token=wrong") == 403
    assert http_status(base + "?token=" + token) == 200
    assert http_status(base + "monitor/app.js", {"X-Locus-Token": token}) == 200
    # The page with its token works whole: its modules (cookie) and its websocket (?token=).
    page = open_page(base + "?token=" + token)
    page.wait_for_selector(LIVE)
    wait_points(page, 3)
