"""What every locus web UI server shares: the static front end (web/), who may talk to it
(loopback host check, token, websocket origin), the listening socket and the run-until-signal
loop. `locus monitor live` (locus.monitor.live) is the first user; `locus view` will be the
next: it adds its own routes, then `add_static_routes`. docs/web.md describes the whole.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import secrets
import signal
import socket
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from locus.errors import LocusError

TOKEN_HEADER = "X-Locus-Token"

# Served with an explicit type: a machine without /etc/mime.types must still serve modules.
CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain",
}

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # The token may be in the page's URL: never send it anywhere in a Referer.
    "Referrer-Policy": "no-referrer",
}

# Nothing but this server: scripts, styles (uPlot sets inline styles), and the websocket of
# the same host (named explicitly: older browsers do not count ws: as 'self').
CSP = (
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self' ws://{host} wss://{host}; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


def find_web_root() -> Path:
    """The web/ directory: $LOCUS_WEB_DIR, else the checkout's web/ (editable install), else a
    copy inside the package (python/locus/web_static, for a future wheel)."""
    here = Path(__file__).resolve().parent
    candidates = []
    if os.environ.get("LOCUS_WEB_DIR"):
        candidates.append(Path(os.environ["LOCUS_WEB_DIR"]))
    candidates += [here.parents[1] / "web", here / "web_static"]
    for c in candidates:
        if (c / "index.html").is_file():
            return c.resolve()
    raise LocusError(
        "the web UI's files (web/index.html) are missing from this installation; "
        "run locus from a checkout or set LOCUS_WEB_DIR"
    )


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_only(netloc: str) -> str:
    """'127.0.0.1:8080' -> '127.0.0.1', '[::1]:80' -> '::1'."""
    netloc = netloc.strip()
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Guard:
    """Who may use the server.

    - bound to loopback: no token, but the Host header must name a loopback host (a page of
      another site that rebinds its DNS name to 127.0.0.1 is refused);
    - bound to anything else: a random token, required on every request as `?token=`, the
      X-Locus-Token header, `Authorization: Bearer`, or the cookie the server sets after the
      first request that carried `?token=` (so the page's own module and asset loads pass);
    - websockets: when the browser sends an Origin, it must be this server (Origin == Host).
    """

    def __init__(self, bind: str, port: int, token: str | None = None):
        self.loopback = is_loopback(bind)
        self.token = None if self.loopback else (token or secrets.token_urlsafe(24))
        self.cookie = f"locus_token_{port}"

    def given_token(self, request: web.Request) -> str | None:
        if request.query.get("token"):
            return request.query["token"]
        if request.headers.get(TOKEN_HEADER):
            return request.headers[TOKEN_HEADER]
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer ") :].strip()
        return request.cookies.get(self.cookie)

    def check(self, request: web.Request) -> None:
        if self.loopback and not is_loopback(host_only(request.host or "")):
            raise web.HTTPForbidden(text="locus: this server only answers to a loopback host\n")
        if self.token is not None:
            given = self.given_token(request) or ""
            if not secrets.compare_digest(given.encode(), self.token.encode()):
                raise web.HTTPForbidden(
                    text="locus: a valid token is required (?token=... as printed at start)\n"
                )

    @staticmethod
    def origin_ok(request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:  # not a browser: the host check and the token still apply
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False
        return parts.netloc.lower() == (request.host or "").lower()

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        self.check(request)
        resp = await handler(request)
        if (
            self.token is not None
            and request.query.get("token")
            and request.cookies.get(self.cookie) != self.token
            and not resp.prepared
        ):
            resp.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        if not resp.prepared:
            for k, v in SECURITY_HEADERS.items():
                resp.headers.setdefault(k, v)
            host = "".join(c for c in (request.host or "") if c.isalnum() or c in ".:-[]")
            resp.headers.setdefault("Content-Security-Policy", CSP.format(host=host))
        return resp


def add_static_routes(app: web.Application, root: Path, index: str = "index.html") -> None:
    """GET / -> root/index, GET /PATH -> root/PATH; never outside root, no listings. Add it
    after the server's own routes (it matches every path)."""
    root = root.resolve()

    async def static(request: web.Request) -> web.StreamResponse:
        rel = request.match_info.get("tail", "") or index
        path = (root / rel).resolve()
        if path != root and root not in path.parents:
            raise web.HTTPNotFound()
        if path.is_dir():
            path = path / index
        if not path.is_file():
            raise web.HTTPNotFound()
        headers = {"Cache-Control": "no-cache"}
        ctype = CONTENT_TYPES.get(path.suffix.lower())
        if ctype:
            headers["Content-Type"] = ctype
        return web.FileResponse(path, headers=headers)

    app.router.add_get("/{tail:.*}", static)


def listen_socket(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise LocusError(f"cannot listen on '{host}': {e.strerror}") from None
    family, type_, proto, _, addr = infos[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise LocusError(f"cannot listen on {url_host(host)}:{port}: {e.strerror}") from None
    return sock


class WebServer:
    """An aiohttp application on its own socket. `await start()`, then `url`, `await close()`."""

    def __init__(self, app: web.Application, sock: socket.socket, bind: str, guard: Guard):
        self.app, self.sock, self.bind, self.guard = app, sock, bind, guard
        self.port = sock.getsockname()[1]
        self.runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )

    @property
    def url(self) -> str:
        url = f"http://{url_host(self.bind)}:{self.port}/"
        return url + (f"?token={self.guard.token}" if self.guard.token else "")

    async def start(self) -> None:
        await self.runner.setup()
        await web.SockSite(self.runner, self.sock).start()

    async def close(self) -> None:
        await self.runner.cleanup()


class StopOnSignal:
    """`async with StopOnSignal() as stop: ... await stop.wait()`: SIGINT and SIGTERM set the
    event instead of raising. Enter it before printing the address, so a signal sent as soon
    as the address is read is never lost."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    async def __aenter__(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self.event.set)
        return self.event

    async def __aexit__(self, *exc) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.remove_signal_handler(sig)
