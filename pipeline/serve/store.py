"""The job table: SQLite in write-ahead-log mode, one short transaction per change.

Every state change is committed before the server acts on it, so a server killed at any moment (SIGKILL included)
restarts with queued jobs still queued and the running one still marked `running` at the stage it had reached:
the runner resumes it from there. A connection per call keeps threads (request handlers, runners) independent;
SQLite's own locking serialises the writers.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = ("succeeded", "failed", "cancelled")

# JSON-encoded columns: decoded on the way out
_JSON = ("options", "eval", "parity", "skipped")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    state TEXT NOT NULL,
    device TEXT NOT NULL,
    data TEXT NOT NULL,
    source TEXT NOT NULL,
    labelled INTEGER NOT NULL,
    recipe TEXT,
    formats TEXT NOT NULL,
    options TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    stage TEXT,
    step INTEGER,
    total_steps INTEGER,
    loss REAL,
    img_s REAL,
    eval TEXT,
    parity TEXT,
    skipped TEXT,
    error TEXT,
    pid INTEGER,
    cancel INTEGER NOT NULL DEFAULT 0,
    resumes INTEGER NOT NULL DEFAULT 0,
    owner TEXT NOT NULL DEFAULT ''
);
"""
# columns added since the first schema: a jobs.db written before them gets them, with their defaults
_ADDED = {"owner": "TEXT NOT NULL DEFAULT ''"}


class Store:
    def __init__(self, path: Path):
        self.path = Path(path)
        with closing(self._connect()) as db:
            db.execute("PRAGMA journal_mode=WAL")  # readers never block the writer; survives a kill mid-write
            db.executescript(_SCHEMA)
            have = {r["name"] for r in db.execute("PRAGMA table_info(jobs)")}
            for name, decl in _ADDED.items():
                if name not in have:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl}")

    def _connect(self) -> sqlite3.Connection:
        # autocommit mode: each statement commits unless an explicit BEGIN opened a transaction
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable against a process kill, fast enough per commit
        return db

    def add(self, *, device: str, data: str, source: str, labelled: bool, recipe: str | None, formats: str,
            options: dict, skipped: list[str], job_id: str | None = None, owner: str = "",
            max_unfinished: int | None = None) -> dict | None:
        """The new job, queued; None if `owner` already has `max_unfinished` jobs queued or running (counted and
        added in one transaction, so concurrent submissions cannot pass the cap together)."""
        job_id = job_id or new_id()
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                if max_unfinished is not None and self._unfinished(db, owner) >= max_unfinished:
                    db.execute("ROLLBACK")
                    return None
                db.execute("INSERT INTO jobs (id, state, device, data, source, labelled, recipe, formats, options, "
                           "created, skipped, owner) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (job_id, device, data, source, int(labelled), recipe, formats, json.dumps(options),
                            time.time(), json.dumps(skipped), owner))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return self.get(job_id)

    @staticmethod
    def _unfinished(db, owner: str) -> int:
        return db.execute("SELECT COUNT(*) FROM jobs WHERE owner = ? AND state IN ('queued', 'running')",
                          (owner,)).fetchone()[0]

    def unfinished(self, owner: str) -> int:
        with closing(self._connect()) as db:
            return self._unfinished(db, owner)

    def get(self, job_id: str) -> dict | None:
        with closing(self._connect()) as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _decode(row) if row else None

    def list(self, owner: str | None = None) -> list[dict]:
        """Every job, oldest first; only `owner`'s when given."""
        with closing(self._connect()) as db:
            if owner is None:
                return [_decode(r) for r in db.execute("SELECT * FROM jobs ORDER BY seq")]
            return [_decode(r) for r in db.execute("SELECT * FROM jobs WHERE owner = ? ORDER BY seq", (owner,))]

    def ended_before(self, when: float, owner: str | None = None) -> list[str]:
        """Jobs that ended (succeeded, failed, cancelled) before `when`: what pruning removes."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT id, owner FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled') "
                              "AND finished < ? ORDER BY seq", (when,)).fetchall()
        return [r["id"] for r in rows if owner is None or r["owner"] == owner]

    def ids(self) -> set[str]:
        with closing(self._connect()) as db:
            return {r[0] for r in db.execute("SELECT id FROM jobs")}

    def devices(self) -> set[str]:
        """Devices with unfinished jobs: the queues a (re)started server must serve."""
        with closing(self._connect()) as db:
            return {r[0] for r in db.execute("SELECT DISTINCT device FROM jobs WHERE state IN ('queued', 'running')")}

    def claim(self, device: str) -> dict | None:
        """The job this device's runner works on next: one left `running` by a killed server first (to resume),
        else the oldest queued one, marked running in the same transaction."""
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT * FROM jobs WHERE device = ? AND state = 'running' ORDER BY seq LIMIT 1",
                                 (device,)).fetchone()
                if row is None:
                    row = db.execute("SELECT * FROM jobs WHERE device = ? AND state = 'queued' ORDER BY seq LIMIT 1",
                                     (device,)).fetchone()
                    if row is not None:
                        db.execute("UPDATE jobs SET state = 'running', started = ? WHERE id = ?", (time.time(), row["id"]))
                else:
                    db.execute("UPDATE jobs SET resumes = resumes + 1 WHERE id = ?", (row["id"],))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return self.get(row["id"]) if row else None

    def update(self, job_id: str, **fields: Any) -> None:
        if not fields:
            return
        for key in _JSON:
            if key in fields and fields[key] is not None:
                fields[key] = json.dumps(fields[key])
        sets = ", ".join(f"{k} = ?" for k in fields)
        with closing(self._connect()) as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*fields.values(), job_id))

    def finish(self, job_id: str, state: str, error: str | None = None) -> None:
        self.update(job_id, state=state, error=error, finished=time.time(), pid=None)

    def cancel(self, job_id: str) -> str | None:
        """Queued: cancelled at once. Running: flagged; the runner stops the child and marks it. Returns the new
        state, or None if the job had already ended."""
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            state = row["state"] if row else None
            if state == "queued":
                db.execute("UPDATE jobs SET state = 'cancelled', finished = ? WHERE id = ?", (time.time(), job_id))
            elif state == "running":
                db.execute("UPDATE jobs SET cancel = 1 WHERE id = ?", (job_id,))
            db.execute("COMMIT")
        return {"queued": "cancelled", "running": "running"}.get(state)

    def cancel_requested(self, job_id: str) -> bool:
        with closing(self._connect()) as db:
            row = db.execute("SELECT cancel FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return bool(row and row["cancel"])

    def delete(self, job_id: str) -> bool:
        """Only a job that is not running; True if a row was removed."""
        with closing(self._connect()) as db:
            cur = db.execute("DELETE FROM jobs WHERE id = ? AND state != 'running'", (job_id,))
        return cur.rowcount == 1


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def _decode(row: sqlite3.Row) -> dict:
    job = dict(row)
    for key in _JSON:
        if job[key] is not None:
            job[key] = json.loads(job[key])
    job["labelled"] = bool(job["labelled"])
    job["cancel"] = bool(job["cancel"])
    return job
