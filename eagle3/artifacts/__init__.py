"""Stage-contract machinery shared by every stage (docs/design.md, 'Stage contract').

Atomic writes, content fingerprints, manifests with reconciled counts, resumable record
files and the stage output directory that ties them together. Importing this package is
cheap (no torch, no transformers), so light stages and tests can use it freely.
"""

from eagle3.artifacts.atomic import (
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    file_sha256,
    is_temp_name,
)
from eagle3.artifacts.console import log_summary, progress
from eagle3.artifacts.fingerprint import canonical_json, fingerprint, to_plain
from eagle3.artifacts.manifest import (
    MANIFEST_NAME,
    STATUS_COMPLETE,
    STATUS_RUNNING,
    STATUS_STOPPED,
    CountsMismatch,
    Manifest,
    format_bytes,
    format_duration,
)
from eagle3.artifacts.records import JsonlError, RecordWriter, RejectWriter, read_jsonl
from eagle3.artifacts.stage_output import (
    REJECTS_NAME,
    STAGE_FORMAT_VERSION,
    StageOutput,
)

__all__ = [
    "MANIFEST_NAME",
    "REJECTS_NAME",
    "STAGE_FORMAT_VERSION",
    "STATUS_COMPLETE",
    "STATUS_RUNNING",
    "STATUS_STOPPED",
    "CountsMismatch",
    "JsonlError",
    "Manifest",
    "RecordWriter",
    "RejectWriter",
    "StageOutput",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "canonical_json",
    "file_sha256",
    "fingerprint",
    "format_bytes",
    "format_duration",
    "is_temp_name",
    "log_summary",
    "progress",
    "read_jsonl",
    "to_plain",
]
