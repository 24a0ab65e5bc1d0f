"""The frames the app and its measurement process exchange over one socket.

A frame is a 4-byte big-endian length followed by that many bytes of pickle. Both ends are this
package run by the same interpreter from the same source tree, so pickle is safe here (nothing
else can write to a socketpair that only the two processes hold) and carries the labs' frozen
dataclasses (ProbeResult, BenchOutcome) unchanged.

App -> worker: {"op": "run", "job": int, "kind": "probe"|"bench"|"cast", ...}, {"op": "cancel", "job": int},
{"op": "exit"}. Worker -> app: {"event": "state", "phase": str}, {"event": "progress", "job", "fraction",
"text"}, {"event": "result", "job", "value"}, {"event": "error", "job", "message"}.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import Any

Frame = dict[str, Any]
"""One message: an "op" (to the worker) or an "event" (from it) and its fields."""
HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 2**20
"""A frame larger than this is a broken stream, not a result (results are a few KiB)."""


class ChannelClosed(Exception):
    """The other end closed the socket (or it broke): no more frames will come."""


class Channel:
    """Length-prefixed pickle frames over a connected stream socket; sends are thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, message: Frame) -> None:
        """Send one frame; ChannelClosed when the other end is gone."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self.sock.sendall(HEADER.pack(len(payload)) + payload)
        except OSError as error:  # BrokenPipeError, ConnectionResetError, a closed socket
            raise ChannelClosed(str(error)) from error

    def receive(self) -> Frame:
        """The next frame (blocking); ChannelClosed at end of stream."""
        (length,) = HEADER.unpack(self._exactly(HEADER.size))
        if length > MAX_FRAME_BYTES:
            raise ChannelClosed(f"frame of {length} bytes: the stream is corrupt")
        try:
            return pickle.loads(self._exactly(length))
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
            raise ChannelClosed(f"unreadable frame: {error}") from error

    def _exactly(self, count: int) -> bytes:
        chunks, missing = [], count
        while missing:
            try:
                chunk = self.sock.recv(min(missing, 1 << 20))
            except OSError as error:
                raise ChannelClosed(str(error)) from error
            if not chunk:
                raise ChannelClosed("end of stream")
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already shut down or never connected
        self.sock.close()
