"""What keeps one client, or many, from holding the server: connection and time limits on uvicorn, and the disk.

uvicorn times out an idle keep-alive connection, but not one that is still sending its request head: a client that
opens connections and trickles header bytes (or none) would keep each open, and enough of them use up the server's
file descriptors until it answers no one. BoundedH11 is uvicorn's own h11 protocol with a deadline on every request
head and a cap on open connections (past it, a new one is closed at once, before any byte is read). The body has its
own idle deadline in the app (a chunk at least every `body_idle_s`).
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from core.errors import PipelineError

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    max_connections: int = 100  # open at once; each page tab holds one for its event stream
    header_timeout_s: float = 10.0  # to send a whole request head
    body_idle_s: float = 30.0  # longest wait for the next chunk of a request body
    keep_alive_s: int = 5  # an idle connection between requests
    max_header_bytes: int = 16 << 10  # h11's cap on a request head still incomplete
    max_unfinished: int = 64  # queued or running jobs per user
    quota: int = 100 << 30  # bytes under the root: uploads, runs, downloads
    disk_reserve: int = 1 << 30  # left free on the file system whatever the quota says


class BoundedH11(H11Protocol):
    """H11Protocol with a deadline on each request head and a cap on open connections (class attributes, set by
    protocol_class)."""

    header_timeout_s = Limits.header_timeout_s
    max_connections = Limits.max_connections
    _head_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.close()  # connection_lost follows and forgets it
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # still inside a request head: the deadline runs on
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def protocol_class(limits: Limits) -> type:
    return type("BoundedH11", (BoundedH11,), {"header_timeout_s": limits.header_timeout_s,
                                              "max_connections": limits.max_connections})


def uvicorn_config(app, host: str, port: int, limits: Limits):
    """The server's uvicorn settings: the limits above, access log off (request lines are noise here), and a
    bounded graceful shutdown: an open progress stream (a browser tab) must not keep Ctrl-C from stopping it."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, http=protocol_class(limits), log_level="warning",
                          access_log=False, timeout_graceful_shutdown=3, limit_concurrency=limits.max_connections + 1,
                          timeout_keep_alive=limits.keep_alive_s, h11_max_incomplete_event_size=limits.max_header_bytes)


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound here and handed to uvicorn rather than bound by it: uvicorn logs a bind error and
    exits with status 3 after `pipeline serve` has printed the address to open. Bound first, an address in use (or
    one this machine does not have) is one line and exit 2, with nothing announced. The family and SO_REUSEADDR
    are uvicorn's own choices for a host and port."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise PipelineError(f"cannot listen on {host} port {port}: {e.strerror or e}; give another --port, or stop "
                            "what is listening there") from None
    return sock


def used_bytes(root: Path) -> int:
    """Bytes of the files under `root` (links not followed)."""
    total = 0
    stack = [Path(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:  # a folder removed while counting (a job deleted)
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def room(root: Path, limits: Limits) -> int:
    """Bytes a new upload may still take: what the quota leaves, and what the disk leaves above its reserve."""
    disk = shutil.disk_usage(root).free - limits.disk_reserve
    return max(0, min(limits.quota - used_bytes(root), disk))


def no_room_message(needed: int, free: int, limits: Limits) -> str:
    return (f"not enough space for this job: it needs {needed / MIB:.1f} MiB, {free / MIB:.1f} MiB is free under the "
            f"server's {limits.quota / MIB:.0f} MiB quota; delete finished jobs (DELETE /jobs/ID or POST /prune)")


def parse_age(text: str) -> float:
    """`30d`, `12h`, `90m`, `45s` (or a number of seconds) as seconds; ValueError otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    scale = units.get(text[-1:], None)
    number = float(text[:-1] if scale else text)
    if not number >= 0 or number == float("inf"):
        raise ValueError(text)
    return number * (scale or 1)
