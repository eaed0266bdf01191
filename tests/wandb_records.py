"""Reads the records of an offline W&B run file (`run-<id>.wandb`) for tests.

The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then
32 KiB blocks of chunks, each with a 7-byte header (crc32c, length, type: 1 full, 2 first,
3 middle, 4 last); every record is a serialized `wandb_internal_pb2.Record`. wandb >= 0.2x
no longer ships a Python reader, and offline runs write no `wandb-summary.json`.

The file is written by the wandb-core service process, which buffers it: `wandb.finish()` can
return before the service has flushed it (a test that read it at once saw only the header, so no
run record and no group). `read_run` therefore waits for the run's `exit` record.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
CHUNK_HEADER = 7


def _payloads(data: bytes):
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1 and version == 0, (ident, magic, version)
    pos, pending = 7, b""
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        if kind == 0 and length == 0:  # zero fill at the end of a block
            pos += left_in_block
            continue
        if pos + CHUNK_HEADER + length > len(data):  # the writer is mid-chunk
            return
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def _records(data: bytes) -> list:
    records = []
    for payload in _payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def _complete_records(path: Path, timeout_s: float) -> list:
    """The records of a run file once its `exit` record is on disk (the run was finished)."""
    deadline = time.monotonic() + timeout_s
    while True:
        data = Path(path).read_bytes()
        try:
            records = _records(data) if len(data) >= 7 else []
        except DecodeError:  # a chunk cut mid-write
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record after {timeout_s:.0f} s ({len(data)} bytes, "
                                 f"{len(records)} records): the run was not finished, or wandb-core "
                                 "has not flushed it")
        time.sleep(0.1)


def read_run(path: Path, timeout_s: float = 60.0) -> dict:
    """History rows, summary, config keys, group and exit code of a finished offline run file."""
    history, summary, config, group, exit_code = [], {}, {}, None, None
    for record in _complete_records(path, timeout_s):
        kind = record.WhichOneof("record_type")
        if kind == "exit":
            exit_code = record.exit.exit_code
        if kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.summary.update})
        if kind == "run" and record.run.run_group:
            group = record.run.run_group
        if kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in updates})
    return {"history": history, "summary": summary, "config": config, "group": group, "exit_code": exit_code}
