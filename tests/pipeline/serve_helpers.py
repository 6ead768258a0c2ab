"""What the job-service tests share: the service over a temporary root (jobs queued, never run), zips of images,
and a real uvicorn on loopback in a thread for the limits only a socket can show."""

from __future__ import annotations

import io
import socket
import stat
import threading
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

from pipeline.serve.app import create_app

TOKEN_B = "b" * 43


def make_app(root: Path, described, **kw):
    kw.setdefault("allow_data", ("synthetic:48",))
    return create_app(root, described, run_jobs=False, **kw)


def token_of(root: Path) -> str:
    return (root / "token").read_text().strip()


def zip_bytes(entries: dict[str, bytes], links: dict[str, str] = {}) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        for name, target in links.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def png(seed: int, side: int = 12) -> bytes:
    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def photos(classes: dict[str, int], top: str = "photos") -> dict[str, bytes]:
    """{class: count} -> zip entries of PNGs in class folders ("" as the class: flat)."""
    out, seed = {}, 0
    for c, n in classes.items():
        for i in range(n):
            out["/".join(filter(None, (top, c, f"{i}.png")))] = png(seed)
            seed += 1
    return out


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@contextmanager
def uvicorn_thread(app, limits):
    """The server's own uvicorn settings (limits.uvicorn_config) on a free loopback port, in a thread."""
    import uvicorn

    from pipeline.serve.limits import uvicorn_config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, limits))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True if the server closes the connection (or resets it) within `seconds`."""
    sock.settimeout(seconds)
    try:
        while True:
            if sock.recv(4096) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
