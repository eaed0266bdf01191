#!/usr/bin/env python
"""What naming a large checkpoint costs: `target_identity` (sampled) against hashing every byte.

Writes a synthetic safetensors checkpoint (`--files` files of `--gib-per-file` GiB, tensors of
`--tensor-mib` MiB) and times, in one process, the sampled identity eagle3 uses above 1 GiB and
a full sha256 of the same files. Each measurement runs after dropping the files from the page
cache where the OS allows it (posix_fadvise DONTNEED), so both read from disk as a first run would.

    python scripts/bench_target_identity.py --dir /tmp/ckpt --files 4 --gib-per-file 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import eagle3.target_info as target_info


def _write_checkpoint(directory: Path, files: int, gib_per_file: float, tensor_mib: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tensor_bytes = tensor_mib << 20
    per_file = max(1, int(gib_per_file * (1 << 30)) // tensor_bytes)
    block = os.urandom(1 << 20)
    for f in range(files):
        header = {f"layers.{f}.{t}.weight": {"dtype": "BF16", "shape": [tensor_bytes // 2],
                                              "data_offsets": [t * tensor_bytes, (t + 1) * tensor_bytes]}
                  for t in range(per_file)}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(directory / f"model-{f:05d}.safetensors", "wb") as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            for _ in range(per_file * tensor_mib):
                fh.write(block)
    (directory / "config.json").write_text(json.dumps({"num_hidden_layers": files}))


def _drop_cache(directory: Path) -> None:
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _full_sha256(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--gib-per-file", type=float, default=1.0)
    parser.add_argument("--tensor-mib", type=int, default=8)
    args = parser.parse_args()
    if not any(args.dir.glob("*.safetensors")):
        _write_checkpoint(args.dir, args.files, args.gib_per_file, args.tensor_mib)
    total = sum(p.stat().st_size for p in args.dir.iterdir())
    _drop_cache(args.dir)
    t0 = time.perf_counter()
    ident = target_info.target_identity(str(args.dir))
    sampled = time.perf_counter() - t0
    _drop_cache(args.dir)
    t0 = time.perf_counter()
    _full_sha256(args.dir)
    full = time.perf_counter() - t0
    print(json.dumps({"bytes": total, "hashed": ident["weights"]["hashed"], "sampled_s": round(sampled, 3),
                      "full_sha256_s": round(full, 3), "full_over_sampled": round(full / sampled, 1)}))


if __name__ == "__main__":
    main()
