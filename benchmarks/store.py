"""Append-only, crash-safe store of benchmark rows (JSON lines, one file per shard).

Each row is one (shape, candidate) and is appended as a single line and
flushed, so a killed process loses nothing written (the OS holds it). Rows are
fsynced at most once a second and on close: a per-row fsync cost milliseconds
on the device machines' disks, a tenth of a measurement, and guards only
against the machine itself going down (which then loses at most a second of
rows). On open, a torn last line is cut off, so a kill loses at most the row in
flight and never duplicates one.
Before a candidate runs, its key is written to an ``.inflight`` marker with the
number of times a process already died inside it. A process that dies inside a
candidate leaves the marker: the next run measures that candidate again, since
the death may have come from outside (a timeout's SIGKILL, a lost lease); if the
process dies inside it a second time, the next run records it as status ``crash``
instead of running it a third time.

Rows that failed for lack of device memory (``out_of_memory``) are stored but do
not count as done: a resume measures them again and appends the new row.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

# Reading row files lives below the store (gemm_costmodel.rows); the names stay importable here.
from gemm_costmodel import registry
from gemm_costmodel.rows import RowsError, read_rows  # noqa: F401

FSYNC_INTERVAL_S = 1.0
# Deaths inside one candidate after which it is recorded as a crash, not run again.
MAX_DEATHS = 2


def row_is_out_of_memory(row: dict) -> bool:
    """A stored row that failed for lack of device memory. Sweeps before the
    ``out_of_memory`` status stored these as compile_error with the allocator's
    message, so the message counts too."""
    return row.get("status") == "out_of_memory" or (
        row.get("status") != "ok" and "out of memory" in str(row.get("error", "")).lower())


# The store key's extra problem columns (registry.key_layout) and their values in rows of ops
# without them: rows of sweeps before the op registry carry no op, E or top_k (dense GEMM rows:
# gemm, E = 1, top_k = 1); rows of one-stage ops carry no stage or routing ('').
_KEY_INTS, _KEY_STRS = registry.key_layout()
_KEY_DEFAULTS = {c: registry.column_default(c) for c in _KEY_INTS + _KEY_STRS}


def row_key(row: dict) -> tuple:
    """Identity of a measurement: (op, dtype, m, n, k, *integer fields, candidate, *string fields),
    the ops' own problem fields (registry.key_layout; today e, top_k and stage, routing) at their
    defaults where a row lacks them."""
    return (row.get("op", registry.LEGACY_OP), row["dtype"], int(row["m"]), int(row["n"]), int(row["k"]),
            *(int(row.get(c, _KEY_DEFAULTS[c])) for c in _KEY_INTS), row["candidate"],
            *(row.get(c, _KEY_DEFAULTS[c]) for c in _KEY_STRS))


class ResultStore:
    """Rows of one shard file, with resume support."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.inflight_path = self.path.with_suffix(self.path.suffix + ".inflight")
        self._done: set[tuple] = set()
        self._retry: set[tuple] = set()  # keys stored only as out_of_memory rows
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
                key = row_key(row)
                if row_is_out_of_memory(row):
                    self._retry.add(key)
                else:
                    self._done.add(key)
            except (ValueError, KeyError, TypeError, IndexError, AttributeError):
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

    @property
    def retry_keys(self) -> set[tuple]:
        """Keys whose only rows are out_of_memory failures (measured again on resume)."""
        return self._retry - self._done

    def append(self, row: dict) -> None:
        """Write one row durably; a row whose key is already stored is ignored
        (an out_of_memory row does not store its key: see the module doc)."""
        key = row_key(row)
        if key in self._done:
            return
        self._fh.write(json.dumps(row, separators=(",", ":"), allow_nan=True) + "\n")
        self._fh.flush()
        if row_is_out_of_memory(row):
            self._retry.add(key)
        else:
            self._done.add(key)
        now = time.monotonic()
        if now - self._last_sync >= FSYNC_INTERVAL_S:
            os.fsync(self._fh.fileno())
            self._last_sync = now

    def begin(self, key: tuple, deaths: int = 0) -> None:
        """Mark key as running; ``deaths``: how often a process already died inside it."""
        self.inflight_path.write_text(json.dumps({"key": list(key), "deaths": int(deaths)}))

    def end(self) -> None:
        if self.inflight_path.exists():
            self.inflight_path.unlink()

    def died_in(self) -> tuple[tuple, int] | None:
        """(key, deaths) of the candidate a previous process died inside, counting that
        death, if any and not stored since; None otherwise."""
        if not self.inflight_path.exists():
            return None
        try:
            marker = json.loads(self.inflight_path.read_text())
            if isinstance(marker, list):  # the marker of older sweeps: the key alone
                marker = {"key": marker, "deaths": 0}
            k = marker["key"]
            ints, strs = len(_KEY_INTS), len(_KEY_STRS)
            if len(k) == 5:  # (dtype, m, n, k, candidate): a dense GEMM before the op registry
                k = [registry.LEGACY_OP, *k[:4], *(_KEY_DEFAULTS[c] for c in _KEY_INTS), k[4]]
            if len(k) == 6 + ints:  # before the string fields: a one-stage op
                k = [*k, *(_KEY_DEFAULTS[c] for c in _KEY_STRS)]
            if len(k) != 6 + ints + strs:
                raise ValueError("not a key")
            key = (k[0], k[1], *(int(v) for v in k[2:5 + ints]), k[5 + ints], *k[6 + ints:])
            deaths = int(marker.get("deaths", 0)) + 1
        except (ValueError, IndexError, TypeError, KeyError, AttributeError):
            return None
        return None if key in self._done else (key, deaths)

    def crashed_key(self) -> tuple | None:
        """Key that a previous process died inside MAX_DEATHS times: record it as a crash."""
        died = self.died_in()
        return died[0] if died is not None and died[1] >= MAX_DEATHS else None

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
