"""A complete unit whose files changed since they were checksummed is refused, never reused.

End to end through the entrypoint on a JSONL stage output (prep): the size check alone would
trust a flipped byte, the recorded sha256 does not.
"""

from __future__ import annotations

import hashlib

import pytest

from eagle3.artifacts import Manifest
from tests.conftest import FIXTURES

RAW = FIXTURES / "raw"
PREP = ("stage=prep", "dataset=glaive_fc", "dataset.sources.glaive_fc.hub_id=null",
        f"dataset.sources.glaive_fc.data_files=[{RAW / 'glaive.jsonl'}]")


def test_cli_refuses_a_complete_prep_unit_with_a_flipped_byte_then_force_rebuilds_it(cli, tmp_path):
    root = tmp_path / "artifacts"
    assert cli(*PREP, root=root).returncode == 0
    [unit] = list((root / "prep").iterdir())
    manifest = Manifest.load(unit)
    [rel] = [name for name in manifest.files if name != "rejects.jsonl"]
    path = unit / rel
    good = path.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x20  # e.g. a letter's case: valid JSON, same size, different data
    path.write_bytes(bytes(bad))

    refused = cli(*PREP, root=root)
    assert refused.returncode == 3, refused.stderr[-2000:]
    [line] = [x for x in refused.stderr.splitlines() if x.startswith("eagle3:")]
    assert f"{rel} sha256 is {hashlib.sha256(bad).hexdigest()}, manifest says {manifest.files[rel]['sha256']}" in line
    assert str(unit) in line and "force=true" in line and "Traceback" not in refused.stderr
    assert path.read_bytes() == bytes(bad)  # refused, not silently rewritten

    assert cli(*PREP, "force=true", root=root).returncode == 0
    assert path.read_bytes() == good
    again = cli(*PREP, root=root)
    assert again.returncode == 0 and "complete, reusing" in again.stdout + again.stderr


@pytest.mark.slow
def test_a_stage_refuses_to_read_an_input_unit_with_a_flipped_byte(cli, tmp_path):
    """`stage=tokenize` alone reads prep's complete output: a changed file must not feed the work."""
    root = tmp_path / "artifacts"
    assert cli(*PREP, "dataset.sources.glaive_fc.track=target_native", root=root).returncode == 0
    [unit] = list((root / "prep").iterdir())
    manifest = Manifest.load(unit)
    [rel] = [name for name in manifest.files if name != "rejects.jsonl"]
    data = bytearray((unit / rel).read_bytes())
    data[len(data) // 3] ^= 0x20
    (unit / rel).write_bytes(bytes(data))

    refused = cli("stage=tokenize", *PREP[1:], "dataset.sources.glaive_fc.track=target_native", root=root)
    assert refused.returncode == 3, refused.stderr[-2000:]
    [line] = [x for x in refused.stderr.splitlines() if x.startswith("eagle3:")]
    assert f"complete output {unit} cannot be trusted: {rel} sha256 is" in line and "force=true" in line
    assert not list((root / "tokenize").glob("*/tokenized_data.jsonl"))  # nothing was tokenized from it
    # The line names the stage whose output must be rebuilt; following it works (force=true on the
    # tokenize command itself would only redo tokenize, and fail on prep again).
    assert "rerun with stage=prep force=true" in line
    fixed = cli("stage=prep", *PREP[1:], "dataset.sources.glaive_fc.track=target_native", "force=true", root=root)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    again = cli("stage=tokenize", *PREP[1:], "dataset.sources.glaive_fc.track=target_native", root=root)
    assert again.returncode == 0, again.stderr[-2000:]
    assert list((root / "tokenize").glob("*/tokenized_data.jsonl"))
