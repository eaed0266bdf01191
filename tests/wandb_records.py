"""Reads the records of an offline W&B run file (`run-<id>.wandb`) for tests.

The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then
32 KiB blocks of chunks, each with a 7-byte header (crc32c, length, type: 1 full, 2 first,
3 middle, 4 last); every record is a serialized `wandb_internal_pb2.Record`. wandb >= 0.2x
no longer ships a Python reader, and offline runs write no `wandb-summary.json`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

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


def read_run(path: Path) -> dict:
    """History rows, summary, config keys and group of an offline run file."""
    history, summary, config, group = [], {}, {}, None
    for payload in _payloads(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.summary.update})
        if kind == "run" and record.run.run_group:
            group = record.run.run_group
        if kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in updates})
    return {"history": history, "summary": summary, "config": config, "group": group}
