"""Reading the harness's JSON-lines row files (the bench shards), below the harness's store and
the dataset loader so that the dataset (data/) need not import the benchmarks to read them."""
from __future__ import annotations

import json


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
