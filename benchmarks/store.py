"""Append-only, crash-safe store of benchmark rows (JSON lines, one file per shard).

Each row is one (shape, candidate) and is appended as a single line and
flushed, so a killed process loses nothing written (the OS holds it). Rows are
fsynced at most once a second and on close: a per-row fsync cost milliseconds
on the device machines' disks, a tenth of a measurement, and guards only
against the machine itself going down (which then loses at most a second of
rows). On open, a torn last line is cut off, so a kill loses at most the row in
flight and never duplicates one.
Before a candidate runs, its key is written to an ``.inflight`` marker; if
the process dies inside the candidate (e.g. an illegal memory access), the
next run finds the marker and records the candidate as status ``crash``
instead of running it again.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

FSYNC_INTERVAL_S = 1.0


def row_key(row: dict) -> tuple:
    """Identity of a measurement: (dtype, m, n, k, candidate)."""
    return (row["dtype"], int(row["m"]), int(row["n"]), int(row["k"]), row["candidate"])


class ResultStore:
    """Rows of one shard file, with resume support."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.inflight_path = self.path.with_suffix(self.path.suffix + ".inflight")
        self._done: set[tuple] = set()
        self._repair_and_load()
        self._fh = open(self.path, "a", encoding="utf-8")
        self._last_sync = time.monotonic()

    def _repair_and_load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good_end = 0
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # torn last line
            line = data[pos:nl]
            try:
                row = json.loads(line)
                self._done.add(row_key(row))
            except (ValueError, KeyError, TypeError, IndexError):
                break  # corrupt line: keep everything before it
            good_end = nl + 1
            pos = nl + 1
        if good_end < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)

    def done(self, key: tuple) -> bool:
        return key in self._done

    @property
    def keys(self) -> set[tuple]:
        return set(self._done)

    def append(self, row: dict) -> None:
        """Write one row durably; a row whose key is already stored is ignored."""
        key = row_key(row)
        if key in self._done:
            return
        self._fh.write(json.dumps(row, separators=(",", ":"), allow_nan=True) + "\n")
        self._fh.flush()
        self._done.add(key)
        now = time.monotonic()
        if now - self._last_sync >= FSYNC_INTERVAL_S:
            os.fsync(self._fh.fileno())
            self._last_sync = now

    def begin(self, key: tuple) -> None:
        """Mark key as running (see module doc)."""
        self.inflight_path.write_text(json.dumps(list(key)))

    def end(self) -> None:
        if self.inflight_path.exists():
            self.inflight_path.unlink()

    def crashed_key(self) -> tuple | None:
        """Key that was running when a previous process died, if any and not stored."""
        if not self.inflight_path.exists():
            return None
        try:
            k = json.loads(self.inflight_path.read_text())
            key = (k[0], int(k[1]), int(k[2]), int(k[3]), k[4])
        except (ValueError, IndexError, TypeError):
            return None
        return None if key in self._done else key

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_rows(paths) -> list[dict]:
    """All complete rows of the given JSONL files (gzipped ones too: shards are committed as .gz)."""
    import gzip

    rows = []
    for p in paths:
        opener = gzip.open if str(p).endswith(".gz") else open
        with opener(p, "rt", encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        break
    return rows
