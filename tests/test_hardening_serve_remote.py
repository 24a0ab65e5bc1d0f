"""`serve` beyond this machine: the page's WebSocket is on the address the browser used (not the bind
address 0.0.0.0, where a browser elsewhere never connects), and an address other machines can reach
needs --allow-remote, since a visitor runs code as this user."""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from tests.cli_runner import run
from tutor.commands import serve

from tests.test_hardening_serve import free_port

QUICK_APP = shlex.join([sys.executable, "-c", "pass"])


@asynccontextmanager
async def server_page(served: str) -> AsyncIterator[tuple[aiohttp.ClientSession, int]]:
    """The guarded server as if bound to `served` (the socket itself on 127.0.0.1: nothing is exposed)."""
    port = free_port()
    server = serve.guarded_server_class()(QUICK_APP, host=served, port=port)
    runner = web.AppRunner(await server._make_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            yield session, port
    finally:
        await runner.cleanup()


async def page(session: aiohttp.ClientSession, port: int, host: str) -> str:
    async with session.get(f"http://127.0.0.1:{port}/", headers={"Host": host}) as response:
        assert response.status == 200
        return await response.text()


def websocket_url(html: str) -> str:
    found = re.search(r'data-session-websocket-url="([^"]*)"', html)
    assert found, html
    return found.group(1)


def test_the_page_connects_back_to_the_address_the_browser_used() -> None:
    async def scenario() -> None:
        async with server_page("0.0.0.0") as (session, port):
            html = await page(session, port, f"192.0.2.10:{port}")
            assert websocket_url(html) == f"ws://192.0.2.10:{port}/ws"
            assert f'href="http://192.0.2.10:{port}/static/css/xterm.css"' in html
            assert "0.0.0.0" not in html
            # A foreign name (DNS rebinding) is never echoed into the page: the session would be refused anyway.
            html = await page(session, port, f"rebind.example:{port}")
            assert "rebind.example" not in html and websocket_url(html) == f"ws://0.0.0.0:{port}/ws"
    asyncio.run(scenario())


def test_on_localhost_the_page_keeps_the_name_the_browser_used() -> None:
    async def scenario() -> None:
        async with server_page("127.0.0.1") as (session, port):
            assert websocket_url(await page(session, port, f"localhost:{port}")) == f"ws://localhost:{port}/ws"
            assert websocket_url(await page(session, port, f"192.0.2.10:{port}")) == f"ws://127.0.0.1:{port}/ws"
    asyncio.run(scenario())


@pytest.mark.parametrize(("served", "request_host", "scheme", "expected"), [
    ("0.0.0.0", "192.0.2.10:8000", "http", "http://192.0.2.10:8000"),
    ("0.0.0.0", "192.0.2.10:8000", "https", "https://192.0.2.10:8000"),
    ("::", "[2001:db8::1]:8000", "http", "http://[2001:db8::1]:8000"),
    ("0.0.0.0", "192.0.2.10:8000/../x", "http", "http://192.0.2.10:8000"),  # rebuilt, never pasted
    ("0.0.0.0", "user@192.0.2.10:8000", "http", "http://192.0.2.10:8000"),
    ("0.0.0.0", "192.0.2.10:9999", "http", "http://0.0.0.0:8000"),  # another port: not this server
    ("0.0.0.0", "tutor.lan:8000", "http", "http://0.0.0.0:8000"),
    ("0.0.0.0", None, "http", "http://0.0.0.0:8000"),
    ("10.0.0.7", "10.0.0.7:8000", "http", "http://10.0.0.7:8000"),
    ("10.0.0.7", "10.0.0.8:8000", "http", "http://10.0.0.7:8000"),
    ("127.0.0.1", "[::1]:8000", "javascript", "http://[::1]:8000"),
])
def test_page_url(served: str, request_host: str | None, scheme: str, expected: str) -> None:
    assert serve.page_url(served, 8000, request_host, scheme) == expected


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("192.0.2.10", False), ("tutor.lan", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert serve.is_loopback(host) is loopback


def test_serving_beyond_this_machine_needs_allow_remote() -> None:
    code, out, err = run(["serve", "--host", "0.0.0.0", "--port", str(free_port())])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, err)
    assert err.startswith("tensor-tutor: error: --host 0.0.0.0") and "--allow-remote" in err
    assert "runs code as this user" in err


def test_allow_remote_starts_and_says_who_runs_what(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[dict] = []

    class NotServing:
        def __init__(self, command: str, **options: object) -> None:
            started.append(options)

        def serve(self) -> None:
            pass

    monkeypatch.setattr(serve, "guarded_server_class", lambda: NotServing)
    port = free_port()
    code, _, err = run(["serve", "--host", "0.0.0.0", "--port", str(port), "--allow-remote"])
    assert code == 0, err
    assert started == [{"host": "0.0.0.0", "port": port, "title": "tensor-tutor"}]
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert "--allow-remote" in warning and "runs code as" in warning and "exercise block" in warning


def test_allow_remote_is_in_the_help() -> None:
    code, out, _ = run(["serve", "--help"])
    assert code == 0 and "--allow-remote" in out and "runs code as you" in " ".join(out.split())
