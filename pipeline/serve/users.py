"""Who may call: one bearer token in `<root>/token` (made at first start), or a users file naming one token each.

With a users file every job belongs to the user whose token submitted it, and a user sees, streams, downloads,
cancels and deletes only their own: another's job answers 404, as one that does not exist (its id tells nothing).
Either file must be readable by its owner alone; a token is compared in constant time.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from core.errors import PipelineError

TOKEN_FILE = "token"
SINGLE_USER = ""  # the owner of every job when there is no users file (and of jobs made before one was given)
NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
MIN_TOKEN = 32


def _private(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise PipelineError(f"{path} is readable by others (mode {mode:04o}): chmod 600 {path}")


def load_or_create_token(root: Path) -> str:
    """The single bearer token: made at first start into a file only its owner can read; a file others can read
    is refused (the token would be theirs too)."""
    path = root / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        _private(path)
        token = path.read_text().strip()
        if len(token) < MIN_TOKEN:
            raise PipelineError(f"token file {path} is damaged: delete it and start again for a new token")
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_users(path: Path) -> dict[str, str]:
    """A users file: `NAME TOKEN` a line (blank lines and `#` comments ignored) -> {token: name}. Refused: a file
    others can read, a malformed line, a short token, a name or a token given twice."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"users file {path} not found")
    _private(path)
    users: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not NAME.match(parts[0]):
            raise PipelineError(f"users file {path} line {n}: expected `NAME TOKEN` (a name of letters, digits, "
                                "_ . @ -)")
        name, token = parts
        if len(token) < MIN_TOKEN:
            raise PipelineError(f"users file {path} line {n}: the token of {name} is shorter than {MIN_TOKEN} "
                                "characters (make one: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        if token in users or name in users.values():
            raise PipelineError(f"users file {path} line {n}: {name} or its token is given twice")
        users[token] = name
    if not users:
        raise PipelineError(f"users file {path} names no user")
    return users


def who(users: dict[str, str], token: str) -> str | None:
    """The user a token belongs to, or None; every known token is compared, in constant time each."""
    found = None
    for known, name in users.items():
        if secrets.compare_digest(known.encode(), token.encode()):
            found = name
    return found
