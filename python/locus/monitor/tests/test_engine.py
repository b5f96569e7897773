"""The engine: event selection, rates from sensors, record shapes and order, the file, the
control calls on a running engine, per-sensor rate caps, failing sensors."""

from __future__ import annotations

import json
import threading
import time

import pytest

from locus.errors import LocusError
from locus.monitor import recordfile
from locus.monitor.engine import Monitor, parse_interval, sensor_classes
from locus.monitor.tests.fakes import Absent, Scripted, wait_for

# -- intervals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,seconds",
    [("100ms", 0.1), ("1s", 1.0), ("500us", 0.0005), ("250", 0.25), ("2 ms", 0.002),
     ("0.5s", 0.5), ("1.5ms", 0.0015)],
)  # fmt: skip
def test_parse_interval(text, seconds):
    assert parse_interval(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["abc", "0", "-1ms", "1h", "50us", "3601s", "", "ms"])
def test_parse_interval_refuses(text):
    with pytest.raises(ValueError):
        parse_interval(text)


# -- selection -----------------------------------------------------------------------------


def test_defaults_globs_and_sensor_names():
    m = Monitor(1.0, None, [Scripted(), Absent()])
    assert [e.id for e in m.events] == ["fake::up", "fake::down"]
    assert m.absent == {"gone": "not on this machine (test)"}
    m = Monitor(1.0, ["fake::l*"], [Scripted()])
    assert [e.id for e in m.events] == ["fake::level"]
    m = Monitor(1.0, ["fake:*"], [Scripted()])
    assert [e.id for e in m.events] == ["fake::up", "fake::down", "fake::level"]  # sensor order
    m = Monitor(1.0, ["fake"], [Scripted(), Scripted("other")])
    assert [e.id for e in m.events] == ["fake::up", "fake::down"]


@pytest.mark.parametrize(
    "events,message",
    [
        (["fake::nope"], "unknown event 'fake::nope'"),
        (["nosuch"], "unknown sensor 'nosuch'"),
        (["gone::x"], "event 'gone::x': sensor 'gone' is absent here: not on this machine"),
        (["gone"], "sensor 'gone' is absent here: not on this machine (test)"),
        ([], "no event to monitor"),
    ],
)
def test_bad_selection_is_a_usage_error(events, message):
    with pytest.raises(LocusError) as e:
        Monitor(1.0, events, [Scripted(), Absent()])
    assert e.value.code == 2
    assert str(e.value).startswith(message)


def test_bad_interval_is_a_usage_error():
    with pytest.raises(LocusError) as e:
        Monitor(0.0, None, [Scripted()])
    assert e.value.code == 2
    with pytest.raises(LocusError):
        Monitor(1.0, None, [Scripted()]).set_interval(7200)


def test_every_sensor_of_the_package_is_found():
    names = [c.name for c in sensor_classes()]
    assert names == ["vmstat", "numastat", "cpu", "psi", "perf", "pmu"]


# -- records -------------------------------------------------------------------------------


def test_samples_are_rates_over_the_measured_interval():
    m = Monitor(0.5, ["fake:*"], [Scripted()])
    got = []
    m.subscribe(got.append)
    m._prime()
    time.sleep(0.02)
    m.sample_once()
    time.sleep(0.03)
    m.sample_once()
    assert len(got) == 2
    for r in got:
        assert set(r) == {"t", "dt", "v"}
        assert r["v"]["fake::up"] == pytest.approx(10 / r["dt"])
        assert r["v"]["fake::down"] == pytest.approx(-4 / r["dt"])  # falls: negative
        assert r["v"]["fake::down"] < 0
    assert got[0]["v"]["fake::level"] == 1 and got[1]["v"]["fake::level"] == 2
    assert 0.015 < got[0]["dt"] < 0.5 and 0.025 < got[1]["dt"] < 0.5


def test_header_and_file(tmp_path):
    path = tmp_path / "m.jsonl"
    m = Monitor(0.25, ["fake:*"], [Scripted(), Absent()])
    m.record_to(str(path))
    m._prime()
    time.sleep(0.01)
    m.sample_once()
    m.label("phase 1")
    m.set_interval(0.1)
    m.pause()
    m.resume()
    m.stop()
    lines = path.read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    h = recs[0]
    assert h["format"] == "locus-monitor" and h["version"] == 1
    assert h["interval_ms"] == 250
    assert set(h["host"]) == {"hostname", "cpus", "nodes", "kernel"}
    assert h["events"][0] == {
        "id": "fake::up", "sensor": "fake", "source": "", "event": "up",
        "unit": "events/s", "kind": "counter", "description": "scripted up",
    }  # fmt: skip
    assert {s["name"]: s["present"] for s in h["sensors"]} == {"fake": True, "gone": False}
    assert [recordfile.kind(r) for r in recs] == [
        "header", "sample", "label", "interval", "paused", "paused",
    ]  # fmt: skip
    assert recs[2]["label"] == "phase 1"
    assert recs[3]["interval_ms"] == 100
    assert recs[4]["paused"] is True and recs[5]["paused"] is False
    ts = [r["t"] for r in recs[1:]]
    assert ts == sorted(ts)
    assert recs[1]["v"]["fake::up"] == pytest.approx(10 / recs[1]["dt"], rel=1e-6)
    header, rest = recordfile.load(str(path))
    assert header == h and len(rest) == 5


def test_record_to_switches_files_and_refuses_bad_paths(tmp_path):
    m = Monitor(0.25, None, [Scripted()])
    m.record_to(str(tmp_path / "a.jsonl"))
    m._prime()
    m.sample_once()
    m.record_to(str(tmp_path / "b.jsonl"))
    m.sample_once()
    m.record_to(None)
    m.sample_once()
    a = (tmp_path / "a.jsonl").read_text().splitlines()
    b = (tmp_path / "b.jsonl").read_text().splitlines()
    assert len(a) == 2 and len(b) == 2
    assert json.loads(b[0])["format"] == "locus-monitor"
    with pytest.raises(OSError):
        m.record_to(str(tmp_path / "no" / "such" / "dir.jsonl"))


def test_running_engine_control_from_another_thread(tmp_path):
    m = Monitor(0.02, None, [Scripted()])
    got, threads = [], set()

    def sub(r):
        got.append(r)
        threads.add(threading.current_thread().name)

    m.subscribe(sub)
    m.record_to(str(tmp_path / "m.jsonl"))
    m.start()
    wait_for(lambda: sum("v" in r for r in got) >= 3)
    m.label("phase 2")
    m.pause()
    wait_for(lambda: any(r.get("paused") is True for r in got))
    n_paused = len(got)
    time.sleep(0.15)
    assert len(got) == n_paused  # no sample while paused
    m.set_interval(0.01)
    m.resume()
    wait_for(lambda: sum("v" in r for r in got[n_paused:]) >= 3)
    m.stop(final_sample=True)
    assert threads == {"locus-monitor"}  # every record came from the sampling thread
    kinds = [recordfile.kind(r) for r in got]
    i = kinds.index("label")
    assert kinds[i : i + 2] == ["label", "paused"]
    assert kinds[n_paused : n_paused + 2] == ["interval", "paused"]
    assert got[n_paused]["interval_ms"] == 10
    after = sorted(r["dt"] for r in got[n_paused + 2 :] if "v" in r)
    # after resume: rates over ~10 ms, never over the paused time (>= 0.15 s)
    assert after[len(after) // 2] < 0.05 and after[-1] < 0.15
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert len(lines) == len(got) + 1  # the file holds exactly what subscribers got
    assert m.sensors[0].closed


def test_slow_sensor_read_every_kth_tick():
    fast, slow = Scripted("fast", 1000.0), Scripted("slow", 100.0)
    m = Monitor(0.001, None, [fast, slow])
    assert m.every("fast") == 1 and m.every("slow") == 10
    got = []
    m.subscribe(got.append)
    m._prime()
    for _ in range(20):
        m.sample_once()
    with_slow = [i for i, r in enumerate(got) if "slow::up" in r["v"]]
    assert with_slow == [0, 10]
    assert all("fast::up" in r["v"] for r in got)
    # the slow sensor's rate is over its own interval: 10 counts since its last read
    r = got[10]["v"]
    assert r["slow::up"] == pytest.approx(10 / slow.last_dt)
    m.set_interval(0.02)
    assert m.every("slow") == 1


def test_failing_sensor_is_dropped_not_fatal(capfd):
    bad = Scripted("bad", fail_after=2)
    m = Monitor(0.1, None, [Scripted(), bad])
    got = []
    m.subscribe(got.append)
    m._prime()
    m.sample_once()
    m.sample_once()
    m.sample_once()
    assert "bad::up" in got[0]["v"] and "bad::up" not in got[1]["v"]
    assert len(got) == 3 and bad.closed
    assert "sensor bad stopped: Input/output error" in capfd.readouterr().err


def test_broken_subscriber_is_removed(capfd):
    m = Monitor(0.1, None, [Scripted()])
    good = []

    def broken(r):
        raise RuntimeError("boom")

    m.subscribe(broken)
    m.subscribe(good.append)
    m._prime()
    m.sample_once()
    m.sample_once()
    assert len(good) == 2
    assert capfd.readouterr().err.count("subscriber failed") == 1


def test_real_sensors_start_and_stop():
    m = Monitor(0.05)
    got = []
    m.subscribe(got.append)
    m.start()
    wait_for(lambda: len(got) >= 2)
    m.stop()
    ids = {e.id for e in m.events}
    assert set(got[-1]["v"]) <= ids
    assert "cpu::user" in ids and "vmstat::numa_hit" in ids
