"""The ``manifest.json`` every stage writes beside its outputs.

A later stage reads its inputs from manifests, never from globals or the working
directory, so the manifest is the contract: what config produced these files, from which
inputs, how many items went in and came out (and why the rest were rejected), and what the
files were when the stage finished. ``status`` separates a finished output from one a
crashed run left behind.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from eagle3.artifacts.atomic import atomic_write_json

__all__ = [
    "MANIFEST_FORMAT_VERSION",
    "MANIFEST_NAME",
    "STATUS_COMPLETE",
    "STATUS_RUNNING",
    "STATUS_STOPPED",
    "CountsMismatch",
    "Manifest",
    "collect_versions",
    "empty_counts",
    "format_bytes",
    "format_duration",
    "utc_now_iso",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT_VERSION = 1
STATUS_RUNNING = "running"
STATUS_COMPLETE = "complete"
#: A run that kept none of its input stopped the stage here (`StageOutput.stop`): never an input of a
#: later stage, and the next run of the same unit starts it over.
STATUS_STOPPED = "stopped"
_STATUSES = (STATUS_RUNNING, STATUS_COMPLETE, STATUS_STOPPED)
_COUNT_KEYS = ("in", "out", "rejected")


class CountsMismatch(ValueError):
    """Raised when ``in != out + sum(rejected)``: some input was dropped without a reason."""


def utc_now_iso() -> str:
    """Current UTC time as ISO 8601, so timestamps from machines in any zone compare."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def empty_counts() -> dict[str, Any]:
    """Counts of a stage that has not processed anything yet."""
    return {"in": 0, "out": 0, "rejected": {}}


def collect_versions() -> dict[str, str | None]:
    """Versions of the software that shaped an artifact, for explaining differences later.

    Read from installed package metadata rather than by importing, so recording them costs
    milliseconds even though importing torch or transformers costs seconds. A package that
    is not installed is recorded as ``None``.
    """
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "transformers", "eagle3"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    if versions["eagle3"] is None:
        try:
            import eagle3

            versions["eagle3"] = getattr(eagle3, "__version__", None)
        except ImportError:
            pass
    return versions


def format_bytes(n: int) -> str:
    """Human-readable size with decimal units (``1.2 MB``), as people read disk usage."""
    value = float(n)
    if value < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000.0
        if value < 999.95 or unit == "PB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_duration(seconds: float | None) -> str:
    """Human-readable wall time: ``3.4 s``, ``2 min 05 s``, ``1 h 07 min``."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f} s"
    total = int(round(seconds))
    if total < 3600:
        return f"{total // 60} min {total % 60:02d} s"
    return f"{total // 3600} h {(total % 3600) // 60:02d} min"


def _sorted_reasons(rejected: dict[str, int]) -> list[tuple[str, int]]:
    # Largest first: the reason that lost the most data is what a reader must see first.
    return sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))


def _rejected_text(rejected: dict[str, int]) -> str:
    total = sum(rejected.values())
    if not rejected:
        return f"rejected={total}"
    reasons = ", ".join(f"{reason}={n}" for reason, n in _sorted_reasons(rejected))
    return f"rejected={total} ({reasons})"


@dataclass
class Manifest:
    """What one stage run for one named unit produced, and from what.

    Attributes:
        stage: Stage name (``prep``, ``tokenize``, ...).
        name: The unit of work within the stage (usually a dataset name).
        fingerprint: Fingerprint of stage, name, config and input fingerprints; also the
            suffix of the output directory name.
        status: ``running`` from the moment work starts, ``complete`` once outputs are final,
            ``stopped`` when the run kept none of its input (its rejects stay to be read).
        config: The config slice the stage ran with, as plain data.
        inputs: Input name -> ``{"path", "fingerprint"}`` of the input's manifest.
        counts: ``in``, ``out``, ``rejected`` (reason -> n) and any stage-specific counters.
        files: Relative path -> ``{"bytes", "sha256"}`` for every output file.
        versions: Python and library versions at run time.
        wall_time_s: Seconds the (last) run took.
        created_at: UTC ISO time the run started.
        completed_at: UTC ISO time the run completed.
        extra: Stage-specific results (e.g. vocab coverage, eval metrics).
        format_version: Version of this file's layout.
        dir: Directory the manifest was loaded from or written to (not serialised).
    """

    stage: str
    name: str
    fingerprint: str
    status: str = STATUS_RUNNING
    config: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=empty_counts)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=collect_versions)
    wall_time_s: float | None = None
    created_at: str = field(default_factory=utc_now_iso)
    completed_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = MANIFEST_FORMAT_VERSION
    dir: Path | None = field(default=None, compare=False, repr=False)

    @property
    def directory(self) -> Path:
        """`dir` of a manifest that was loaded or written (an error for one that was neither)."""
        if self.dir is None:
            raise ValueError(f"manifest {self.stage}/{self.name} was neither loaded nor written: it has no directory")
        return self.dir

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready copy of every field except ``dir``."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "dir"}
        # A deep copy via JSON, so callers mutating the result cannot alter the manifest.
        return json.loads(json.dumps(data))

    @classmethod
    def from_dict(cls, data: dict[str, Any], dir: str | Path | None = None) -> Manifest:
        """Rebuild a manifest, refusing data that is not one.

        Unknown keys are refused rather than dropped: a manifest written by a newer layout
        would otherwise be read as if it said less than it does.

        Raises:
            ValueError: Missing required keys, unknown keys, bad status or layout version.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a manifest must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls) if f.name != "dir"}
        missing = [key for key in ("stage", "name", "fingerprint") if key not in data]
        if missing:
            raise ValueError(f"manifest is missing required keys: {', '.join(missing)}")
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"manifest has unknown keys: {', '.join(unknown)}")
        if data.get("status", STATUS_RUNNING) not in _STATUSES:
            raise ValueError(f"manifest status must be one of {list(_STATUSES)}, got {data.get('status')!r}")
        version = data.get("format_version", MANIFEST_FORMAT_VERSION)
        if version != MANIFEST_FORMAT_VERSION:
            raise ValueError(
                f"manifest format_version {version!r} is not supported (this eagle3 reads {MANIFEST_FORMAT_VERSION})"
            )
        kwargs = json.loads(json.dumps(data))
        kwargs.setdefault("versions", {})
        manifest = cls(**kwargs)
        manifest.dir = Path(dir) if dir is not None else None
        return manifest

    def write(self, dir: str | Path) -> Path:
        """Atomically write ``dir/manifest.json`` and remember ``dir``.

        Returns:
            The path written.
        """
        from eagle3.config.secrets import redact  # defence in depth: validation refuses secrets first

        directory = Path(dir)
        path = directory / MANIFEST_NAME
        atomic_write_json(path, redact(self.to_dict()))
        self.dir = directory
        return path

    @classmethod
    def load(cls, dir: str | Path) -> Manifest:
        """Read a manifest from a stage directory (or from the ``manifest.json`` path itself).

        Raises:
            FileNotFoundError: No manifest there.
            ValueError: The file is not valid JSON or not a manifest; the message names it.
        """
        path = Path(dir)
        if path.name == MANIFEST_NAME and not path.is_dir():
            directory = path.parent
        else:
            directory, path = path, path / MANIFEST_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(f"no {MANIFEST_NAME} in {directory}") from None
        try:
            data = json.loads(text)
            return cls.from_dict(data, dir=directory)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    # ------------------------------------------------------------------ paths it recorded
    # Every unit lives at `<root>/<stage>/<unit dir>`, and a unit's inputs under the same root. A
    # manifest records absolute paths, so a root copied (`cp -a rootA rootB`) or moved would send its
    # readers back to the old root; these map a recorded path to the same place under the root the
    # manifest is read from now.
    def input_dir(self, name: str) -> Path:
        """The directory of input `name`, under the root this manifest is read from (not the one it was written in)."""
        if self.dir is None:
            return Path(self.inputs[name]["path"])
        recorded = Path(self.inputs[name]["path"])
        return Path(self.dir).parent.parent / recorded.parent.name / recorded.name

    def relocate(self, recorded: str | Path) -> Path:
        """A path this manifest recorded, moved with its root when it lay under the root of the run that wrote it.

        That root is read off the recorded inputs (each `<root>/<stage>/<unit>`); a path outside it (an
        `extract.store_root` on another disk) is returned unchanged.
        """
        path = Path(recorded)
        if self.dir is None or not self.inputs:
            return path
        written_root = Path(next(iter(self.inputs.values()))["path"]).parent.parent
        if not path.is_relative_to(written_root):
            return path
        return Path(self.dir).parent.parent / path.relative_to(written_root)

    # ------------------------------------------------------------------ checks & display
    @property
    def total_bytes(self) -> int:
        """Sum of the recorded output file sizes."""
        return sum(int(info.get("bytes", 0)) for info in self.files.values())

    @property
    def rejected(self) -> dict[str, int]:
        """Rejected counts by reason (empty when nothing was rejected)."""
        return dict(self.counts.get("rejected") or {})

    def reconcile(self) -> None:
        """Check that every input is accounted for: ``in == out + sum(rejected)``.

        Raises:
            CountsMismatch: With a one-line message giving all three numbers and the reasons.
        """
        n_in = self.counts.get("in", 0)
        n_out = self.counts.get("out", 0)
        rejected = self.rejected
        if n_in != n_out + sum(rejected.values()):
            raise CountsMismatch(
                f"counts do not reconcile for {self.stage}/{self.name}: "
                f"in={n_in} != out={n_out} + {_rejected_text(rejected)}"
            )

    def summary_line(self) -> str:
        """One line for logs and terminals: counts, reject reasons, size, time, location."""
        counts = self.counts
        parts = [f"in={counts.get('in', 0)}", f"out={counts.get('out', 0)}", _rejected_text(self.rejected)]
        parts += [f"{key}={value}" for key, value in sorted(counts.items()) if key not in _COUNT_KEYS]
        line = (
            f"[{self.stage}] {self.name}  {' '.join(parts)}  "
            f"bytes={format_bytes(self.total_bytes)}  time={format_duration(self.wall_time_s)}"
        )
        if self.status != STATUS_COMPLETE:
            line += f"  status={self.status}"
        if self.dir is not None:
            line += f"  -> {self.dir}"
        return line
