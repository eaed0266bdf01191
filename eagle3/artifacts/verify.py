"""Whether a complete stage output on disk is still the one its manifest describes.

Reusing a complete unit re-checks every file against its manifest entry: the size, and the
sha256 wherever one was recorded (``StageOutput.finalize(checksums=True)``, the default). A
mismatch is refused with one line naming the file and ``force=true`` (:class:`UntrustedOutput`),
never reused. Refusing rather than silently redoing the unit: every unit stage can rebuild its
output from its inputs with ``force=true``, but a changed file means a failing disk or a person at
work, and both deserve to be seen before hours of training are redone over them.

The hash costs one read of the unit per process (sha256 runs at roughly 0.5-2 GB/s per core, so
a multi-GB unit costs seconds); a file already hashed by this process and unchanged since (same
inode, size, mtime and ctime) is not hashed again.
"""

from __future__ import annotations

from pathlib import Path

from eagle3.artifacts.atomic import file_sha256
from eagle3.artifacts.manifest import Manifest
from eagle3.errors import Eagle3Error

__all__ = ["UntrustedOutput", "check_reusable"]

#: (device, inode, size, mtime, ctime) of a file -> its sha256, for files hashed by this process.
#: A reused unit is hashed once per process, not once per job of an in-process sweep; any write
#: to the file changes its mtime/ctime and so misses the cache.
_HASHED: dict[tuple[int, ...], str] = {}


class UntrustedOutput(Eagle3Error, ValueError):
    """A complete output's files are missing or differ from what its manifest recorded."""


def _verified_sha256(path: Path) -> str:
    st = path.stat()
    stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if stamp not in _HASHED:
        _HASHED[stamp] = file_sha256(path)
    return _HASHED[stamp]


def check_reusable(directory: Path, manifest: Manifest, fingerprint: str) -> None:
    """Refuse to reuse a complete output whose files are not the ones its manifest recorded.

    Sizes catch truncation and missing files; the recorded sha256 catches a same-size change
    (bit rot, a hand edit, another program overwriting a file).

    Raises:
        UntrustedOutput: One line naming up to five problems and ``force=true``.
    """
    problems = []
    if manifest.fingerprint != fingerprint:
        problems.append(f"its fingerprint is {manifest.fingerprint}, expected {fingerprint}")
    for rel, info in sorted(manifest.files.items()):
        path = directory / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != info.get("bytes"):
            problems.append(f"{rel} has {path.stat().st_size} bytes, manifest says {info.get('bytes')}")
        elif info.get("sha256"):
            actual = _verified_sha256(path)
            if actual != info["sha256"]:
                problems.append(f"{rel} sha256 is {actual}, manifest says {info['sha256']}")
    if problems:
        raise UntrustedOutput(
            f"complete output {directory} cannot be trusted: {'; '.join(problems[:5])}"
            f"{' ...' if len(problems) > 5 else ''}; rebuild it: rerun with stage={manifest.stage} force=true "
            "(and this command's other overrides), then this command"
        )
