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


class RowsError(ValueError):
    """A result file that cannot be read whole. The message is one line naming the file
    (and the line, for a corrupt one) and how many of its rows were read before it."""

    def __init__(self, path, line: int | None, reason: str, rows_read: int):
        self.path, self.line, self.rows_read = str(path), line, rows_read
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {reason}; {rows_read} rows read before it")


def read_rows(paths, strict: bool = False) -> list[dict]:
    """All rows of the given JSONL files (gzipped ones too: shards are committed as .gz).

    A line that is not a JSON object, a gzip stream cut short or undecodable bytes raise
    RowsError naming file:line: stopping there quietly would summarise or train on part
    of a file as if it were whole. One exception unless ``strict``: the torn last line
    (no newline, not JSON) of an uncompressed file is skipped, since that is a shard
    still being written (ResultStore cuts it on resume); a committed .gz never has one.
    """
    import gzip
    import zlib

    rows = []
    for p in paths:
        gz = str(p).endswith(".gz")
        opener = gzip.open if gz else open
        lineno, n_file = 0, 0
        try:
            with opener(p, "rt", encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    text = line.strip()
                    if not text:
                        continue
                    try:
                        row = json.loads(text)
                    except ValueError as exc:
                        if not strict and not gz and not line.endswith("\n"):
                            break  # torn last line of a shard being written
                        reason = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else exc
                        raise RowsError(p, lineno, f"corrupt line, not JSON ({reason})", n_file) from None
                    if not isinstance(row, dict):
                        raise RowsError(p, lineno, f"corrupt line, a JSON {type(row).__name__} instead of an object",
                                        n_file)
                    rows.append(row)
                    n_file += 1
        except EOFError:
            raise RowsError(p, None, f"gzip stream cut short after line {lineno} (truncated file)", n_file) from None
        except UnicodeDecodeError as exc:
            # Decoding runs ahead by a buffer, so the bad bytes are somewhere after this line.
            raise RowsError(p, None, f"not UTF-8 text after line {lineno} ({exc.reason})", n_file) from None
        except (OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            raise RowsError(p, None, f"unreadable: {exc}", n_file) from None
    return rows
