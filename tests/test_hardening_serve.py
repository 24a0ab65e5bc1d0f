"""`serve` refuses WebSockets from foreign origins, caps its sessions, and fails in one line.

The server runs for real (textual-serve's aiohttp app on a free port), spoken to with aiohttp's client
as a browser would: the Origin header is what a browser sends and a page cannot forge.
"""

from __future__ import annotations

import asyncio
import shlex
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from tests.cli_runner import run
from tutor.commands import serve

def assert_one_line_error(argv: list[str], fragment: str) -> None:
    code, _, err = run(argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, (code, err)
    assert err.startswith("tensor-tutor: error:") and fragment in err and "Traceback" not in err, err


QUICK_APP = shlex.join([sys.executable, "-c", "pass"])  # a session process that exits at once: no tutor started


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@asynccontextmanager
async def running_server(max_sessions: int = serve.MAX_SESSIONS) -> AsyncIterator[tuple[object, int]]:
    port = free_port()
    server = serve.guarded_server_class()(QUICK_APP, host="127.0.0.1", port=port, max_sessions=max_sessions)
    runner = web.AppRunner(await server._make_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield server, port
        await sessions_drop_to(server, 0)  # each session's process is reaped before the loop closes
    finally:
        await runner.cleanup()


async def sessions_drop_to(server: object, count: int) -> None:
    for _ in range(250):  # the server sees a close on its own turn of the loop
        if server.sessions <= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{server.sessions} sessions still open, expected {count}")


async def handshake(session: aiohttp.ClientSession, port: int, origin: str | None, host: str | None = None):
    headers = {key: value for key, value in (("Origin", origin), ("Host", host)) if value is not None}
    return await session.ws_connect(f"http://127.0.0.1:{port}/ws", headers=headers)


async def refused_status(session: aiohttp.ClientSession, port: int, origin: str | None,
                         host: str | None = None) -> int:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await handshake(session, port, origin, host)
    return refused.value.status


def test_websocket_from_a_foreign_origin_is_refused() -> None:
    async def scenario() -> None:
        async with running_server() as (server, port), aiohttp.ClientSession() as session:
            for origin in ("http://evil.example", f"http://evil.example:{port}", "null", None,
                           f"http://127.0.0.1:{port + 1}", f"file://127.0.0.1:{port}"):
                assert await refused_status(session, port, origin) == 403, origin
            # DNS rebinding: a foreign name resolved to 127.0.0.1, Host and Origin agreeing, still refused.
            assert await refused_status(session, port, f"http://rebind.example:{port}",
                                        f"rebind.example:{port}") == 403
            assert server.sessions == 0
            for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
                socket_ = await handshake(session, port, origin)
                assert server.sessions == 1
                await socket_.close()
                await sessions_drop_to(server, 0)
    asyncio.run(scenario())


def test_sessions_are_capped() -> None:
    async def scenario() -> None:
        async with running_server(max_sessions=2) as (server, port), aiohttp.ClientSession() as session:
            origin = f"http://127.0.0.1:{port}"
            first, second = await handshake(session, port, origin), await handshake(session, port, origin)
            assert server.sessions == 2
            assert await refused_status(session, port, origin) == 503
            await first.close()
            await sessions_drop_to(server, 1)
            third = await handshake(session, port, origin)
            await second.close()
            await third.close()
    asyncio.run(scenario())


def test_the_cap_is_in_the_help() -> None:
    code, out, _ = run(["serve", "--help"])
    assert code == 0 and f"at most {serve.MAX_SESSIONS} at once" in " ".join(out.split())
    assert "other web site is refused" in " ".join(out.split())


@pytest.mark.parametrize(("origin", "host", "served", "allowed"), [
    ("http://[::1]:8000", None, "::1", True),
    ("http://localhost:8000", None, "127.0.0.1", True),
    ("https://localhost:8000", None, "127.0.0.1", True),
    ("http://localhost", None, "127.0.0.1", False),
    ("http://192.168.1.5:8000", "192.168.1.5:8000", "0.0.0.0", True),
    ("http://192.168.1.5:8000", "10.0.0.1:8000", "0.0.0.0", False),
    ("http://tutor.lan:8000", "tutor.lan:8000", "0.0.0.0", False),
    ("http://10.0.0.7:8000", None, "10.0.0.7", True),
    ("http://10.0.0.8:8000", None, "10.0.0.7", False),
    ("http://[bad", None, "127.0.0.1", False),
])
def test_origin_rule(origin: str, host: str | None, served: str, allowed: bool) -> None:
    assert serve.origin_allowed(origin, served, 8000, host) is allowed


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(["serve", "--port", str(port)], f"port {port} is already in use")


@pytest.mark.parametrize("host", ["999.1.1.1", "", "no such host.invalid"])
def test_invalid_host_is_one_line(host: str) -> None:
    assert_one_line_error(["serve", "--host", host, "--port", str(free_port())], "--host")
