"""`tensor-tutor serve`: the tutor app in a browser, through textual-serve.

Each browser tab starts its own `python -m tutor learn` process on this machine, so every tab's
measurements run on this machine's hardware. Bound to localhost unless --host says otherwise, and an
address other machines can reach needs --allow-remote: a visitor runs code as this user (an exercise
block exec()s the Python typed in the page in the worker, and benchmarks run here), so serving beyond
this machine is a choice said out loud, never a typo of --host.

The page's WebSocket address is the one the browser used (its Host header, when the Origin rule below
would accept a session from it), not the bind address: a page opened at http://192.0.2.10:8000 from a
server bound to 0.0.0.0 connects to ws://192.0.2.10:8000, where ws://0.0.0.0:8000 would go nowhere.

A WebSocket is a session that runs the tutor here, so it is guarded: browsers let any web page open a
WebSocket to localhost, so one whose Origin is not the served address is refused (403), and at most
MAX_SESSIONS sessions run at once (503 beyond), since each is a process that can run benchmarks. A tab
closed gives its slot back as soon as its WebSocket closes (its process is then asked to quit, and
killed if it has not within QUIT_GRACE_S). A session is refused (503) when the server has fewer than
SESSION_DESCRIPTORS file descriptors to spare, rather than accepted and then dropped: the server keeps
serving the tabs it has.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import shlex
import socket
import sys
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import click

from tutor.errors import UserError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::")
MAX_SESSIONS = 4
"""Browser sessions at once: each runs its own tutor process (and may run benchmarks) on this machine."""
SESSION_DESCRIPTORS = 12
"""File descriptors a new session may need: its socket, its process's three pipes (both ends while it
starts) and the child watcher's, with room for the page requests that come with it."""
QUIT_GRACE_S = 10.0
"""How long a closed tab's tutor process has to quit before it is killed (its slot is free already)."""


def spare_descriptors() -> tuple[int, int] | None:
    """(file descriptors this process may still open, its limit), or None where that cannot be known
    (no /proc/self/fd or no resource module: then no session is refused for it)."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        in_use = len(os.listdir("/proc/self/fd")) - 1  # listdir's own descriptor
    except (ImportError, OSError):
        return None
    if limit == resource.RLIM_INFINITY:
        return None
    return limit - in_use, limit


def _kill_if_running(app_service: Any) -> None:
    process = getattr(app_service, "_process", None)  # textual-serve's AppService keeps it here
    if process is not None and process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass


def app_command(lesson_id: str | None = None) -> str:
    """The shell command textual-serve runs for each browser session."""
    parts = [sys.executable, "-m", "tutor", "learn"] + ([lesson_id] if lesson_id else [])
    return shlex.join(parts)


def public_url(host: str, port: int) -> str:
    """The address the browser opens (IPv6 literals in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only: localhost, or a loopback IP literal."""
    if host.lower() in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def remote_warning(host: str, port: int) -> str:
    user = os.environ.get("USER") or os.environ.get("USERNAME") or "this user"
    return (f"tensor-tutor: warning: listening on {host}:{port} for other machines (--allow-remote): anyone who "
            f"can reach it runs code as {user} here (an exercise block runs the Python typed in the page, and "
            "benchmarks run on this machine); serve only on a network you trust")


def check_remote(host: str, allow_remote: bool) -> None:
    """Refuse, in one line, an address other machines can reach unless --allow-remote says so."""
    if not allow_remote and not is_loopback(host):
        raise UserError(f"--host {host} lets other machines in, and a visitor runs code as this user (exercise "
                        "blocks run the Python typed in the page): add --allow-remote to serve beyond this machine")


def page_url(host: str, port: int, request_host: str | None, scheme: str = "http") -> str:
    """The address the page's links and WebSocket use: the one the browser asked for (Host header)
    when a session from there would be accepted (origin_allowed: so never a rebound DNS name), rebuilt
    from its parsed parts; else public_url (the bind address)."""
    scheme = scheme if scheme in ("http", "https") else "http"
    if request_host and origin_allowed(f"{scheme}://{request_host}", host, port, request_host):
        parsed = _host_and_port(request_host)
        if parsed is not None:
            hostname, _ = parsed
            return public_url(hostname, port).replace("http://", f"{scheme}://", 1)
    return public_url(host, port)


def _host_and_port(netloc_or_url: str) -> tuple[str, int | None] | None:
    """(hostname, port) of an Origin ("http://host:port") or a Host header ("host:port"); None if malformed."""
    try:
        parts = urlsplit(netloc_or_url if "//" in netloc_or_url else f"//{netloc_or_url}")
        port = parts.port
    except ValueError:
        return None
    if parts.hostname is None:
        return None
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.hostname.lower(), port if port is not None else default


def _is_ip_literal(hostname: str) -> bool:
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        return False
    return True


def origin_allowed(origin: str | None, host: str, port: int, request_host: str | None) -> bool:
    """Whether a WebSocket's Origin header is the served address.

    Served on localhost: any local name of it (localhost, 127.0.0.1, [::1]) on this port. Served on a
    named address: that address on this port. Served on every interface (0.0.0.0, ::): the address the
    browser used (the Host header), if it is an IP literal or localhost, since a DNS name could be
    rebound to this machine by a foreign site. A missing or opaque ("null") Origin is refused.
    """
    if not origin or origin == "null":
        return False
    parsed = _host_and_port(origin)
    if parsed is None or urlsplit(origin).scheme not in ("http", "https"):
        return False
    hostname, origin_port = parsed
    if origin_port != port:
        return False
    if host in LOCAL_HOSTS:
        return hostname in LOCAL_HOSTS
    if host in WILDCARD_HOSTS:
        requested = _host_and_port(request_host or "")
        return (requested == (hostname, origin_port) or requested == (hostname, None)) and (
            _is_ip_literal(hostname) or hostname == "localhost")
    return hostname == host.lower().strip("[]")


def check_can_listen(host: str, port: int) -> None:
    """Refuse, in one line, a host that is not an address here or a port already in use (the server
    would otherwise fail with a traceback deep inside asyncio)."""
    if not host or host != host.strip():
        raise UserError(f"--host {host!r}: give an address such as 127.0.0.1, or 0.0.0.0 for every interface")
    try:
        candidates = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise UserError(f"--host {host}: not an address this machine can listen on ({why})") from None
    for family, kind, protocol, _, address in candidates:
        with socket.socket(family, kind, protocol) as probe:
            if hasattr(socket, "SO_REUSEADDR") and sys.platform != "win32":
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds on POSIX
            try:
                probe.bind(address)
            except OSError as error:
                raise _listen_error(host, port, error) from None


def _listen_error(host: str, port: int, error: OSError) -> UserError:
    if error.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", None)):
        return UserError(f"port {port} is already in use on {host}: choose another with --port "
                         f"(e.g. --port {port + 1 if port < 65535 else 8080})")
    if error.errno == errno.EADDRNOTAVAIL:
        return UserError(f"--host {host}: not an address of this machine")
    if error.errno == errno.EACCES:
        return UserError(f"not allowed to listen on port {port} (ports below 1024 need privileges): "
                         "choose another with --port")
    return UserError(f"cannot listen on {host}:{port} ({error.strerror or error})")


@lru_cache(maxsize=1)
def guarded_server_class() -> type:
    """textual-serve's Server with the Origin check and the session cap (imported on first use)."""
    import aiohttp_jinja2
    from aiohttp import web
    from textual_serve.server import Server, to_int

    class GuardedServer(Server):
        def __init__(self, command: str, *, host: str, port: int, max_sessions: int = MAX_SESSIONS,
                     **options: Any) -> None:
            super().__init__(command, host=host, port=port, public_url=public_url(host, port), **options)
            self.max_sessions = max_sessions
            self._open: set[asyncio.Task] = set()  # one task per session, from handshake to socket closed

        @property
        def sessions(self) -> int:
            return len(self._open)

        @aiohttp_jinja2.template("app_index.html")
        async def handle_index(self, request: web.Request) -> dict[str, Any]:
            # textual-serve's page, with its URLs on the address the browser used (page_url), not the
            # bind address: a page from a server bound to 0.0.0.0 must not point at ws://0.0.0.0.
            base = page_url(self.host, self.port, request.headers.get("Host"), request.scheme)
            router = request.app.router
            websocket = ("wss" if base.startswith("https:") else "ws") + base[base.index(":"):]
            return {
                "font_size": to_int(request.query.get("fontsize", "16"), 16),
                "app_websocket_url": f"{websocket}{router['websocket'].url_for()}",
                "config": {"static": {"url": f"{base}{router['static'].url_for(filename='/')}".rstrip("/") + "/"}},
                "application": {"name": self.title},
            }

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            origin = request.headers.get("Origin")
            if not origin_allowed(origin, self.host, self.port, request.headers.get("Host")):
                click.echo(f"tensor-tutor: refused a session from origin {origin!r} (not {self.public_url})",
                           err=True)
                raise web.HTTPForbidden(text=f"tensor-tutor: sessions are only accepted from {self.public_url}")
            if self.sessions >= self.max_sessions:
                raise web.HTTPServiceUnavailable(
                    text=f"tensor-tutor: {self.max_sessions} sessions are open already (the most at once); "
                         "close one and reload")
            spare = spare_descriptors()
            if spare is not None and spare[0] < SESSION_DESCRIPTORS:
                click.echo(f"tensor-tutor: refused a session: {spare[0]} of {spare[1]} file descriptors left", err=True)
                raise web.HTTPServiceUnavailable(
                    text=f"tensor-tutor: the server is out of file descriptors ({spare[0]} of {spare[1]} left); "
                         "close a tab, or restart it after raising `ulimit -n`")
            task = asyncio.current_task()
            assert task is not None  # aiohttp runs each handler as a task of the event loop
            self._open.add(task)  # one event loop: no lock needed
            try:
                return await super().handle_websocket(request)
            finally:
                self._open.discard(task)

        async def _process_messages(self, websocket: web.WebSocketResponse, app_service: Any) -> None:
            # Runs in the session's own task until the tab's WebSocket closes; textual-serve then waits
            # for the process to quit, which need not hold the slot (a closed tab frees it at once).
            try:
                await super()._process_messages(websocket, app_service)
            finally:
                self._open.discard(asyncio.current_task())
                asyncio.get_running_loop().call_later(QUIT_GRACE_S, _kill_if_running, app_service)

    return GuardedServer


@click.command("serve", help=f"""Run the tutor app in a browser: open http://HOST:PORT.

Each browser tab is a session that runs its own tutor process on this machine: at most
{MAX_SESSIONS} at once. Sessions are accepted only from pages served at this address (a WebSocket
from any other web site is refused). An address other machines can reach (--host 0.0.0.0) needs
--allow-remote: a visitor runs code as you (exercise blocks run the Python typed in the page).""")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (localhost only by default).")
@click.option("--port", default=8000, show_default=True, type=int, help="TCP port.")
@click.option("--allow-remote", is_flag=True,
              help="Allow an address other machines can reach: anyone who reaches it runs code as you.")
@click.argument("lesson_id", required=False)
def serve(host: str, port: int, allow_remote: bool, lesson_id: str | None) -> None:
    if not 1 <= port <= 65535:
        raise UserError(f"--port must be from 1 to 65535, got {port}")
    if lesson_id is not None:
        from tutor.lessons import load_curriculum

        lesson_id = load_curriculum().lesson(lesson_id).info.id
    try:
        server_class = guarded_server_class()
    except ImportError:
        raise UserError("serving in a browser needs textual-serve: pip install textual-serve") from None
    check_can_listen(host, port)  # first: an address that is no address is said as such
    check_remote(host, allow_remote)
    if not is_loopback(host):
        click.echo(remote_warning(host, port), err=True)
    click.echo(f"tensor-tutor: serving the app at {public_url(host, port)} (at most {MAX_SESSIONS} sessions; "
               "Ctrl-C stops)", err=True)
    try:
        server_class(app_command(lesson_id), host=host, port=port, title="tensor-tutor").serve()
    except OSError as error:  # taken between the check and the bind
        raise _listen_error(host, port, error) from None
