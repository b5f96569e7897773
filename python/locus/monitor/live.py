"""`locus monitor live`: the web UI (web/monitor/) and a websocket at /ws streaming the
monitor's records in batches. The protocol is in docs/web.md.

The sampling thread only appends each record to a list under a lock; every FLUSH_S the
event loop takes the list, serialises each record once, and queues one batch message for
every client, so a 1 kHz interval costs ten messages a second per client, not a thousand.
Each client has its own queue and sending task: a slow one delays nobody else.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import sys
import threading
from typing import Any

from aiohttp import WSMsgType, web

from locus import __version__
from locus.errors import LocusError
from locus.webserver import (
    Guard,
    StopOnSignal,
    WebServer,
    add_static_routes,
    find_web_root,
    listen_socket,
)

FLUSH_S = 0.1
HISTORY_S = 60.0  # what a new client gets on connect ...
HISTORY_MAX_SAMPLES = 3000  # ... at most (a 1 kHz interval gives 3 s of history)
HISTORY_MAX_OTHER = 1000  # labels, interval and pause records
HISTORY_MAX_BYTES = 8 << 20  # ... and at most this much JSON (many events: fewer samples)
QUEUE_MAX = 100  # a client this many messages (~10 s) behind is dropped
INTERVAL_MS_MIN, INTERVAL_MS_MAX = 0.1, 3_600_000  # the engine's own limits
LABEL_MAX = 200


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def dumps(record: Any) -> str:
    """Compact JSON; NaN and infinities (which JSON.parse refuses) become null."""
    try:
        return json.dumps(record, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(record), separators=(",", ":"), allow_nan=False)


class Client:
    """One websocket and its own queue of messages, sent in order by its own task: a slow
    client delays nobody else, and is dropped when it falls QUEUE_MAX messages behind."""

    def __init__(self, ws: web.WebSocketResponse):
        self.ws = ws
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        try:
            while True:
                await self.ws.send_str(await self.queue.get())
        except Exception:  # the socket closed under us: its reader ends the client
            pass

    def put(self, msg: str) -> bool:
        if self.queue.qsize() >= QUEUE_MAX:
            return False
        self.queue.put_nowait(msg)
        return True

    async def close(self, code: int, why: str) -> None:
        self.task.cancel()
        if not self.ws.closed:
            await self.ws.close(code=code, message=why.encode())


class LiveHub:
    """The monitor's records -> every connected websocket, plus the recent history."""

    def __init__(self, monitor):
        self.monitor = monitor
        self.clients: set[Client] = set()
        self._lock = threading.Lock()
        self._pending: list[dict] = []
        self._samples: collections.deque[tuple[float, str]] = collections.deque()
        self._samples_bytes = 0
        self._other: collections.deque[tuple[float, str]] = collections.deque(
            maxlen=HISTORY_MAX_OTHER
        )
        self._task: asyncio.Task | None = None

    # -- sampling thread -------------------------------------------------------------------
    def on_record(self, record: dict) -> None:
        with self._lock:
            self._pending.append(record)

    # -- event loop ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.flush()
        for c in list(self.clients):
            await c.close(1001, "server shutting down")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self.flush()

    def _take(self) -> list[str]:
        with self._lock:
            batch, self._pending = self._pending, []
        out = []
        for rec in batch:
            if "format" in rec:  # a header: clients learn it from "hello"
                continue
            s = dumps(rec)
            out.append(s)
            t = float(rec.get("t", 0.0))
            if "v" in rec:
                self._samples.append((t, s))
                self._samples_bytes += len(s)
            else:
                self._other.append((t, s))
        self._trim()
        return out

    def _trim(self) -> None:
        s = self._samples
        while s and (
            len(s) > HISTORY_MAX_SAMPLES
            or self._samples_bytes > HISTORY_MAX_BYTES
            or s[-1][0] - s[0][0] > HISTORY_S
        ):
            self._samples_bytes -= len(s.popleft()[1])
        if s:
            while self._other and self._other[0][0] < s[0][0] - HISTORY_S:
                self._other.popleft()

    def flush(self) -> None:
        """Take the pending records and queue one batch for every client. No await from
        taking the records to queuing them, so none is missed or sent twice."""
        records = self._take()
        if not records or not self.clients:
            return
        msg = '{"type":"batch","records":[' + ",".join(records) + "]}"
        for c in list(self.clients):
            if not c.put(msg):
                self.clients.discard(c)
                asyncio.get_running_loop().create_task(c.close(1008, "too slow"))

    def hello(self) -> str:
        history = sorted(list(self._samples) + list(self._other), key=lambda p: p[0])
        m = self.monitor
        head = {
            "type": "hello",
            "server": {"name": "locus", "version": __version__, "lens": "monitor"},
            "header": m.header(),
            "interval_ms": round(m.interval_s * 1000.0, 6),
            "paused": bool(m.paused),
        }
        return dumps(head)[:-1] + ',"history":[' + ",".join(s for _, s in history) + "]}"

    async def handle_ws(self, request: web.Request) -> web.StreamResponse:
        if not Guard.origin_ok(request):
            raise web.HTTPForbidden(text="locus: websocket from another origin\n")
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=1 << 16)
        await ws.prepare(request)
        client = Client(ws)
        client.put(self.hello())
        self.clients.add(client)  # no await since hello(): no record missed or sent twice
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    err = await self.command(msg.data)
                    if err:
                        client.put(dumps({"type": "error", "message": err}))
                elif msg.type == WSMsgType.ERROR:
                    break
        finally:
            self.clients.discard(client)
            client.task.cancel()
        return ws

    async def command(self, text: str) -> str | None:
        """One client message; returns an error text or None."""
        try:
            msg = json.loads(text)
        except ValueError:
            return "not JSON"
        if not isinstance(msg, dict):
            return "not a JSON object"
        try:
            return await self._command(msg)
        except (LocusError, ValueError, OSError) as e:
            return str(e)

    async def _command(self, msg: dict) -> str | None:
        kind = msg.get("type")
        m = self.monitor
        if kind == "interval":
            ms = msg.get("interval_ms")
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms):
                return "interval_ms must be a number"
            if not INTERVAL_MS_MIN <= ms <= INTERVAL_MS_MAX:
                return f"interval_ms must be within {INTERVAL_MS_MIN}..{INTERVAL_MS_MAX}"
            await asyncio.to_thread(m.set_interval, ms / 1000.0)
        elif kind == "label":
            text = msg.get("text")
            if not isinstance(text, str):
                return "label text must be a string"
            text = " ".join(text.split())[:LABEL_MAX]
            if not text:
                return "empty label"
            await asyncio.to_thread(m.label, text)
        elif kind == "pause":
            await asyncio.to_thread(m.pause)
        elif kind == "resume":
            await asyncio.to_thread(m.resume)
        else:
            return f"unknown message type {kind!r}"
        return None


class LiveServer:
    """The monitor, its hub and the web server; `await start()`, `url`, `await close()`.
    The monitor and FIFO are given (tests pass fakes); the server starts and stops them."""

    def __init__(self, monitor, fifo=None, bind: str = "127.0.0.1", port: int = 0):
        self.monitor, self.fifo, self.bind = monitor, fifo, bind
        self.hub = LiveHub(monitor)
        sock = listen_socket(bind, port)
        self.guard = Guard(bind, sock.getsockname()[1])
        app = web.Application(middlewares=[self.guard.middleware])
        app.router.add_get("/ws", self.hub.handle_ws)
        add_static_routes(app, find_web_root())
        self.web = WebServer(app, sock, bind, self.guard)

    @property
    def url(self) -> str:
        return self.web.url

    @property
    def port(self) -> int:
        return self.web.port

    async def start(self) -> None:
        self.monitor.subscribe(self.hub.on_record)
        self.monitor.start()
        if self.fifo is not None and hasattr(self.fifo, "start"):  # else reads from creation
            self.fifo.start()
        self.hub.start()
        await self.web.start()

    async def close(self) -> None:
        close_fifo(self.fifo)
        self.monitor.unsubscribe(self.hub.on_record)
        await asyncio.to_thread(self.monitor.stop)
        await self.hub.stop()
        await self.web.close()


def close_fifo(fifo) -> None:
    """ControlFifo.close() (idempotent); stop() for an older or fake one."""
    if fifo is not None:
        (getattr(fifo, "close", None) or fifo.stop)()


async def _serve(monitor, fifo, bind: str, port: int) -> None:
    async with StopOnSignal() as stop:
        server = LiveServer(monitor, fifo, bind, port)
        await server.start()
        try:
            print(f"locus: monitor live at {server.url}", file=sys.stderr, flush=True)
            if fifo is not None:
                print(f"locus: control FIFO: {fifo.path}", file=sys.stderr, flush=True)
            if bind in ("0.0.0.0", "::"):
                print(
                    f"locus: listening on every interface: from another machine, put this "
                    f"machine's name or address in place of {bind}",
                    file=sys.stderr,
                    flush=True,
                )
            await stop.wait()
        finally:
            await server.close()


def main(ns) -> int:
    """`locus monitor live`: ns.bind, ns.port, ns.interval (seconds), ns.events."""
    from locus.monitor.engine import Monitor
    from locus.monitor.fifo import ControlFifo

    bind = getattr(ns, "bind", None) or "127.0.0.1"
    port = getattr(ns, "port", None) or 0
    interval = getattr(ns, "interval", None) or 1.0
    monitor = Monitor(interval_s=interval, events=getattr(ns, "events", None))
    fifo = ControlFifo(monitor)
    try:
        asyncio.run(_serve(monitor, fifo, bind, port))
    finally:
        close_fifo(fifo)  # also when the server could not start: no FIFO left behind
    return 0
