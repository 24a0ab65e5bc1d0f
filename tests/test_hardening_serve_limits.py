"""`tensor-tutor serve` frees a closed tab's slot at once and survives running out of file
descriptors (it refuses the session in one 503 and keeps serving).

A real `tensor-tutor serve` runs on a free port, spoken to with aiohttp's client as a browser would
(the Origin of the served page). Each session it accepts starts a real tutor process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest

from tutor.commands.serve import MAX_SESSIONS

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups and rlimits")
GUARD = aiohttp.ClientTimeout(total=60)  # a hang guard, not a measured figure


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def real_server(tmp_path: Path, descriptor_limit: int | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()

    def limit_descriptors() -> None:
        if descriptor_limit is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptor_limit, descriptor_limit))

    server = subprocess.Popen([sys.executable, "-m", "tutor", "serve", "--port", str(port)],
                              stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.PIPE, text=True,
                              preexec_fn=limit_descriptors, start_new_session=True,
                              env={**os.environ, "TENSOR_TUTOR_DATA_DIR": str(tmp_path / "data")})
    try:
        for line in server.stderr:  # wait for the server to say it is listening
            if "serving the app at" in line:
                break
        else:
            pytest.fail(f"serve ended before listening (exit {server.wait()})")
        yield server, f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the server and every session's tutor process
        server.wait()


async def wait_until_serving(session: aiohttp.ClientSession, origin: str) -> None:
    """The server prints its address before it binds: wait for the first page it answers."""
    for _ in range(600):
        try:
            async with session.get(f"{origin}/") as page:
                if page.status == 200:
                    return
        except aiohttp.ClientConnectorError:
            await asyncio.sleep(0.05)
    pytest.fail(f"{origin} never answered")


async def open_tab(session: aiohttp.ClientSession, origin: str) -> aiohttp.ClientWebSocketResponse:
    return await session.ws_connect(f"{origin}/ws?width=80&height=24", headers={"Origin": origin})


def test_a_closed_tab_frees_its_slot_at_once(tmp_path: Path) -> None:
    async def scenario(origin: str) -> int:
        async with aiohttp.ClientSession(timeout=GUARD, connector=aiohttp.TCPConnector(force_close=True)) as session:
            await wait_until_serving(session, origin)
            tabs = [await open_tab(session, origin) for _ in range(MAX_SESSIONS)]
            await tabs.pop().close()  # the tab is closed; its tutor process may still be quitting
            try:
                tabs.append(await open_tab(session, origin))
                return 101
            except aiohttp.WSServerHandshakeError as refused:
                return refused.status
            finally:
                for tab in tabs:
                    await tab.close()

    with real_server(tmp_path) as (_, origin):
        assert asyncio.run(scenario(origin)) == 101


def test_out_of_descriptors_refuses_the_session_and_keeps_serving(tmp_path: Path) -> None:
    async def scenario(origin: str) -> tuple[int, str, int]:
        async with aiohttp.ClientSession(timeout=GUARD, connector=aiohttp.TCPConnector(force_close=True)) as session:
            await wait_until_serving(session, origin)
            tabs = []
            try:
                for _ in range(MAX_SESSIONS):
                    try:
                        tabs.append(await open_tab(session, origin))
                    except aiohttp.WSServerHandshakeError as refused:
                        # The refusal's text: a plain GET is refused the same way, before any upgrade.
                        async with session.get(f"{origin}/ws", headers={"Origin": origin}) as again:
                            refusal = (refused.status, await again.text())
                        break
                else:
                    pytest.fail(f"{MAX_SESSIONS} sessions accepted under a {LIMIT}-descriptor limit")
                async with session.get(f"{origin}/") as page:
                    return (*refusal, page.status)
            finally:
                for tab in tabs:
                    await tab.close()

    LIMIT = 24
    with real_server(tmp_path, descriptor_limit=LIMIT) as (server, origin):
        status, text, page_status = asyncio.run(scenario(origin))
        assert server.poll() is None  # still serving
    assert status == 503 and "out of file descriptors" in text and f"of {LIMIT} left" in text
    assert page_status == 200
