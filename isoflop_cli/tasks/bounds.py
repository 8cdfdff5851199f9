"""How much of a problem file a reader may hold, checked before its rows become Python objects.

Every run keeps all rows of its files in memory (as Python strings and lists, several times their
bytes), so one oversized row or file would be OOM-killed in every attempt after `plan` and the
preflight passed it. Both are refused when the config is checked instead:

- a file: at most MAX_FILE_BYTES of data (a JSONL file's size; a parquet file's uncompressed size,
  from its metadata; a `save_to_disk` directory's Arrow tables);
- a row: at most `max_row_bytes(task.max_prompt_tokens)`. A prompt over task.max_prompt_tokens is
  dropped anyway, and no tokenizer's tokens average BYTES_PER_TOKEN bytes, so a longer prompt is
  one no run would use; ROW_ALLOWANCE is room for the answer and the columns custom rewards read
  (test cases ...). JSONL lines are measured as they are read, at most one limit of bytes at a
  time; Arrow columns by their value lengths, without converting them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from isoflop_cli.tasks.base import TaskError

MAX_FILE_BYTES = 4 << 30
BYTES_PER_TOKEN = 64  # generous: real vocabularies' tokens average 3-5 bytes of text, their longest a few dozen
ROW_ALLOWANCE = 16 << 20


def max_row_bytes(prompt_tokens: int | None) -> int:
    return ROW_ALLOWANCE + BYTES_PER_TOKEN * (prompt_tokens or 0)


def _size(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def _row_refusal(where: str, size: int, limit: int) -> TaskError:
    return TaskError(
        f"{where} holds {_size(size)}, above the {_size(limit)} a row may hold ({BYTES_PER_TOKEN} "
        "bytes per token of task.max_prompt_tokens, a prompt longer than that is dropped anyway, "
        f"and {_size(ROW_ALLOWANCE)} for its answer and other columns): remove or shorten the row"
    )


def check_file(where: str, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise TaskError(
            f"{where} holds {_size(size)} of data, above the {_size(MAX_FILE_BYTES)} a problem "
            "file may hold (every run keeps all its rows in memory): give a subset of it"
        )


def jsonl_lines(f: IO[bytes], where: str, limit: int) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a JSONL file opened in binary, each line read at most `limit` bytes
    at a time: a longer one is refused before the rest of it is read."""
    check_file(where, os.fstat(f.fileno()).st_size)
    line_no = 0
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        line_no += 1
        if len(line.rstrip(b"\r\n")) > limit:
            raise _row_refusal(f"{where} line {line_no}", len(line) + _rest_of_line(f), limit)
        yield line_no, line


def _rest_of_line(f: IO[bytes]) -> int:
    """How many bytes the line being read still has (counted in chunks, not held)."""
    rest = 0
    while chunk := f.readline(1 << 16):
        rest += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return rest


def check_parquet(path: Path, where: str, limit: int) -> None:
    """A parquet file's size from its metadata; each row's from the value lengths of the row groups
    larger than one row may be (a row group within the limit holds no row beyond it)."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    groups = [parquet.metadata.row_group(i) for i in range(parquet.num_row_groups)]
    check_file(where, sum(g.total_byte_size for g in groups))
    first = 0
    for i, group in enumerate(groups):
        if group.total_byte_size > limit:
            _check_rows(parquet.read_row_group(i), where, limit, first)
        first += group.num_rows


def check_table(table, where: str, limit: int) -> None:
    """A `save_to_disk` data set's Arrow table (memory-mapped: measuring it reads no value)."""
    check_file(where, table.nbytes)
    _check_rows(table, where, limit, 0)


def _check_rows(table, where: str, limit: int, first: int) -> None:
    sizes = sum((_value_bytes(column) for column in table.columns), np.zeros(table.num_rows, dtype=np.int64))
    if len(sizes) and sizes.max() > limit:
        row = int(sizes.argmax())
        raise _row_refusal(f"{where} row {first + row}", int(sizes[row]), limit)


def _value_bytes(array) -> np.ndarray:
    """Per row of an Arrow array, the bytes of its values (strings by their length, lists and
    structs as the sum of their parts), computed in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _value_bytes(array.dictionary_decode())
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        values = _value_bytes(array.flatten())
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        return np.bincount(parents, weights=values, minlength=len(array)).astype(np.int64)
    if pa.types.is_struct(kind):
        return sum((_value_bytes(field) for field in array.flatten()), np.zeros(len(array), dtype=np.int64))
    try:
        width = max(kind.bit_width // 8, 1)
    except ValueError:  # a type of no fixed width left above (a fixed-size list, a union): its buffers' share
        width = array.nbytes // max(len(array), 1)
    return np.full(len(array), width, dtype=np.int64)
