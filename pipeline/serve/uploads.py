"""A zip of images, checked whole before anything is extracted, then extracted into one folder and nowhere else.

Refused before a byte is written: not a zip, encrypted entries, no files, more entries than the cap, a name that is
absolute or climbs out with `..` (zip-slip), a symbolic link, a declared total beyond the cap, or an entry whose
declared size is more than `max_ratio` times its compressed size (a decompression bomb). zipfile stops each entry
at its declared size and fails its CRC if the data says otherwise, so a header that lies cannot get past the caps.
macOS metadata (`__MACOSX/`, dot files) is skipped and listed; files that are not images are left for the data stage,
which skips and lists them (skipped.txt) as it does for any folder.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO


class UploadError(ValueError):
    """A refused upload; the message says what is wrong with it."""


class NoRoom(Exception):
    """The zip is sound but unpacks to more than the disk quota leaves: `needed` bytes."""

    def __init__(self, needed: int):
        super().__init__(needed)
        self.needed = needed


@dataclass
class ZipCaps:
    max_files: int = 100_000  # a photo library, not a filesystem
    max_total: int = 2 << 30  # bytes once extracted
    max_ratio: float = 200.0  # JPEG/PNG barely compress; bombs reach 1000x and more
    ratio_floor: int = 1 << 20  # entries below 1 MiB are not judged by ratio (a tiny text file compresses 100x)


@dataclass
class Extracted:
    root: Path  # what the data SPEC points at: the folder, or its one top-level folder
    files: int
    labelled: bool  # class sub-folders present
    skipped: list[str]
    size: int  # bytes written


def check_zip(fileobj: BinaryIO, caps: ZipCaps) -> tuple[zipfile.ZipFile, list[zipfile.ZipInfo], list[str], int]:
    """Open and vet the whole archive; return it with the entries to extract, the names skipped and the bytes they
    unpack to."""
    try:
        zf = zipfile.ZipFile(fileobj)
    except (zipfile.BadZipFile, OSError, EOFError):
        raise UploadError("the upload is not a zip file") from None
    infos = zf.infolist()
    if len(infos) > caps.max_files:
        raise UploadError(f"the zip has {len(infos)} entries, more than the limit of {caps.max_files}")
    keep, skipped, total = [], [], 0
    for info in infos:
        name = info.filename
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or "\x00" in name:
            raise UploadError(f"the zip entry {name!r} has an absolute path")
        if ".." in parts:
            raise UploadError(f"the zip entry {name!r} climbs out of its folder (`..`)")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise UploadError(f"the zip entry {name!r} is a symbolic link")
        if info.flag_bits & 0x1:
            raise UploadError(f"the zip entry {name!r} is encrypted")
        if info.is_dir():
            continue
        total += info.file_size
        if total > caps.max_total:
            raise UploadError(f"the zip unpacks to more than {caps.max_total} bytes (the limit)")
        if info.file_size > caps.ratio_floor and info.file_size > caps.max_ratio * max(info.compress_size, 1):
            raise UploadError(f"the zip entry {name!r} expands {info.file_size / max(info.compress_size, 1):.0f}x, "
                              f"more than the limit of {caps.max_ratio:g}x (a decompression bomb?)")
        if parts[0] == "__MACOSX" or any(p.startswith(".") for p in parts):
            skipped.append(name)
            continue
        keep.append(info)
    if not keep:
        raise UploadError("the zip holds no files")
    return zf, keep, skipped, sum(info.file_size for info in keep)


def extract(fileobj: BinaryIO, dest: Path, caps: ZipCaps, room: int | None = None) -> Extracted:
    """Vet, then extract into `dest` (created; must not exist). Raises UploadError with nothing left behind, or
    NoRoom before writing when the entries unpack to more than `room` bytes."""
    zf, keep, skipped, size = check_zip(fileobj, caps)
    if room is not None and size > room:
        raise NoRoom(size)
    dest.mkdir(parents=True, mode=0o700)
    base = dest.resolve()
    try:
        for info in keep:
            target = (base / info.filename.replace("\\", "/")).resolve()
            if not target.is_relative_to(base):  # checked above; resolve() is the last word
                raise UploadError(f"the zip entry {info.filename!r} would land outside the job folder")
            for folder in reversed(target.relative_to(base).parents[:-1]):  # each one private, not just the last
                (base / folder).mkdir(exist_ok=True, mode=0o700)
            # O_EXCL | O_NOFOLLOW: never write through a link or over a file an earlier entry made
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as out, zf.open(info) as src:
                shutil.copyfileobj(src, out, 1 << 20)
    except FileExistsError as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise UploadError(f"the zip holds {Path(e.filename).name!r} twice") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise UploadError(f"the zip is damaged ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    root = base
    # A zipped folder usually wraps everything in one top-level folder: train on what is inside it
    entries = [p for p in root.iterdir()]
    if len(entries) == 1 and entries[0].is_dir():
        root = entries[0]
    labelled = any(p.is_dir() for p in root.iterdir())
    return Extracted(root=root, files=len(keep), labelled=labelled, skipped=skipped, size=size)
