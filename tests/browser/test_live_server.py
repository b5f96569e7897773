"""The live server (locus.monitor.live) without a browser and without sensors: a fake engine
(fake_engine.py, the engine's API) feeds it, aiohttp's client talks to it. The protocol is
docs/web.md's: hello with history, batches, the four client messages; who may connect."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from locus.monitor import live
from locus.monitor.live import LiveServer, dumps

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("locus_fake_engine", HERE / "fake_engine.py")
fake = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fake  # dataclasses look their module up
_spec.loader.exec_module(fake)


def run(coro_fn, interval_s=0.01, bind="127.0.0.1"):
    """Run coro_fn(server, session) against a live server fed by the fake engine."""

    async def main():
        mon = fake.Monitor(interval_s)
        server = LiveServer(mon, None, bind, 0)
        await server.start()
        try:
            # unsafe: keep cookies of a numeric host, as browsers do
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as session:
                return await coro_fn(server, session)
        finally:
            await server.close()

    return asyncio.run(main())


def base(server) -> str:
    return f"http://127.0.0.1:{server.port}/"


async def collect(ws, seconds: float) -> list[dict]:
    out = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = await ws.receive(timeout=left)
        except asyncio.TimeoutError:
            break
        if msg.type != aiohttp.WSMsgType.TEXT:
            break
        out.append(json.loads(msg.data))
    return out


def records(msgs: list[dict]) -> list[dict]:
    out = []
    for m in msgs:
        out += m.get("history", []) if m["type"] == "hello" else m.get("records", [])
    return out


def test_hello_then_batches_not_one_message_per_sample():
    async def scenario(server, session):
        await asyncio.sleep(0.3)
        async with session.ws_connect(base(server) + "ws") as ws:
            msgs = await collect(ws, 1.0)
        return msgs

    msgs = run(scenario, interval_s=0.001)
    hello = msgs[0]
    assert hello["type"] == "hello"
    assert hello["header"]["format"] == "locus-monitor"
    assert hello["interval_ms"] == 1.0 and hello["paused"] is False
    assert hello["history"], "no history on connect"
    batches = [m for m in msgs[1:] if m["type"] == "batch"]
    nsamples = sum(len(b["records"]) for b in batches)
    # ~10 batches a second (FLUSH_S), each carrying many samples.
    assert 3 <= len(batches) <= 20, len(batches)
    assert nsamples > 5 * len(batches), (nsamples, len(batches))


def test_every_record_once_for_a_late_client():
    async def scenario(server, session):
        async with session.ws_connect(base(server) + "ws") as a:
            first = asyncio.ensure_future(collect(a, 1.2))
            await asyncio.sleep(0.5)
            async with session.ws_connect(base(server) + "ws") as b:
                second = await collect(b, 0.6)
            return await first, second

    a, b = run(scenario, interval_s=0.002)
    ta = [r["t"] for r in records(a) if "v" in r]
    tb = [r["t"] for r in records(b) if "v" in r]
    assert tb == sorted(set(tb)), "late client: a sample twice or out of order"
    assert ta == sorted(set(ta))
    # B's view (history + batches) is exactly A's over the same span: no gap, no repeat.
    assert tb == [t for t in ta if tb[0] <= t <= tb[-1]]


def test_client_messages_reach_the_monitor_and_every_client():
    async def scenario(server, session):
        url = base(server) + "ws"
        async with session.ws_connect(url) as a, session.ws_connect(url) as b:
            await a.send_json({"type": "interval", "interval_ms": 250})
            await a.send_json({"type": "label", "text": "phase\n2"})
            await a.send_json({"type": "pause"})
            await a.send_json({"type": "resume"})
            await a.send_json({"type": "interval", "interval_ms": 0})
            await a.send_json({"type": "nope"})
            await a.send_str("not json")
            ma, mb = await asyncio.gather(collect(a, 0.8), collect(b, 0.8))
            return server.monitor.interval_s, ma, mb

    interval_s, ma, mb = run(scenario)
    assert interval_s == 0.25
    for msgs in (ma, mb):
        recs = records(msgs)
        assert 250.0 in [r["interval_ms"] for r in recs if "interval_ms" in r]
        assert "phase 2" in [r.get("label") for r in recs]
        assert [r["paused"] for r in recs if "paused" in r] == [True, False]
    errors = [m["message"] for m in ma if m["type"] == "error"]
    assert len(errors) == 3, errors
    assert not [m for m in mb if m["type"] == "error"]  # errors go to the sender only


def test_loopback_refuses_foreign_host_and_origin():
    async def scenario(server, session):
        url = base(server)
        port = server.port
        out = {}
        async with session.get(url) as r:
            out["plain"] = r.status
            out["csp"] = "Content-Security-Policy" in r.headers
        async with session.get(url, headers={"Host": f"evil.example:{port}"}) as r:
            out["rebound"] = r.status
        async with session.get(url + "monitor/app.js") as r:
            out["js"] = (r.status, r.content_type)
        async with session.get(url + "..%2fpyproject.toml") as r:
            out["escape"] = r.status
        for origin in (f"http://127.0.0.1:{port}", "http://evil.example", "null"):
            try:
                async with session.ws_connect(url + "ws", origin=origin) as ws:
                    await ws.receive(timeout=5)
                    out[origin] = 101
            except aiohttp.WSServerHandshakeError as e:
                out[origin] = e.status
        return out

    out = run(scenario)
    port_origin = [k for k in out if k.startswith("http://127.0.0.1")][0]
    assert out["plain"] == 200 and out["csp"]
    assert out["rebound"] == 403
    assert out["js"] == (200, "text/javascript")
    assert out["escape"] == 404
    assert out[port_origin] == 101
    assert out["http://evil.example"] == 403
    assert out["null"] == 403


def test_token_off_loopback_and_its_cookie():
    async def scenario(server, session):
        url, token = base(server), server.guard.token
        out = {"printed": server.url}
        async with session.get(url) as r:
            out["none"] = r.status
        async with session.get(url + "ws") as r:
            out["ws"] = r.status
        async with session.get(url, headers={"Authorization": f"Bearer {token}"}) as r:
            out["bearer"] = r.status
        async with session.get(url, params={"token": token}) as r:
            out["query"] = r.status
        async with session.get(url + "main.js") as r:  # the cookie set just above
            out["cookie"] = r.status
        async with session.ws_connect(url + "ws", params={"token": token}) as ws:
            out["hello"] = json.loads((await ws.receive(timeout=5)).data)["type"]
        return out

    out = run(scenario, bind="0.0.0.0")
    assert "?token=" in out["printed"]
    assert out["none"] == 403 and out["ws"] == 403
    assert out["bearer"] == 200 and out["query"] == 200 and out["cookie"] == 200
    assert out["hello"] == "hello"


def test_dumps_never_writes_nan():
    s = dumps({"t": 1.0, "v": {"a": float("nan"), "b": float("inf"), "c": 1.5}})
    assert json.loads(s) == {"t": 1.0, "v": {"a": None, "b": None, "c": 1.5}}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_exits_zero_on_signal(sig):
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fake_engine.py"), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(HERE.parents[1] / "python"), "PATH": "/usr/bin:/bin"},
    )
    lines = [proc.stderr.readline(), proc.stderr.readline()]
    assert "monitor live at http://127.0.0.1:" in lines[0], lines
    assert "control FIFO:" in lines[1], lines
    proc.send_signal(sig)
    rest = proc.stderr.read()
    assert proc.wait(timeout=15) == 0, rest
    assert "Traceback" not in rest


def test_history_is_bounded():
    hub = live.LiveHub(fake.Monitor(0.001))
    t0 = 1000.0
    for i in range(live.HISTORY_MAX_SAMPLES + 500):
        hub.on_record({"t": t0 + i * 0.001, "dt": 0.001, "v": {"x": 1.0}})
    hub.on_record({"t": t0 + 100.0, "dt": 0.001, "v": {"x": 1.0}})  # 100 s later
    hub._take()
    assert len(hub._samples) <= live.HISTORY_MAX_SAMPLES
    assert hub._samples[-1][0] - hub._samples[0][0] <= live.HISTORY_S


def test_a_client_that_does_not_read_is_dropped(monkeypatch):
    monkeypatch.setattr(live, "QUEUE_MAX", 5)

    class StuckSocket:
        closed = False
        close_code = None

        async def send_str(self, msg):
            await asyncio.Event().wait()  # never returns: the peer reads nothing

        async def close(self, code, message):
            self.closed, self.close_code = True, code

    async def scenario():
        hub = live.LiveHub(fake.Monitor(0.01))
        ws = StuckSocket()
        client = live.Client(ws)
        hub.clients.add(client)
        for i in range(10):
            hub.on_record({"t": float(i), "dt": 0.01, "v": {"x": 1.0}})
            hub.flush()
        await asyncio.sleep(0.05)
        return hub.clients, ws

    clients, ws = asyncio.run(scenario())
    assert not clients
    assert ws.closed and ws.close_code == 1008
