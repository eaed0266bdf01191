"""The repository stands on its own: its design is `docs/design.md`, and nothing it tracks points at
documents outside the checkout (a clone does not have them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from eagle3.paths import PROJECT_ROOT
from eagle3.stages import stage_names

ROOT = PROJECT_ROOT  # the checkout, whatever the working directory
DESIGN = ROOT / "docs" / "design.md"
# How files used to cite the design and facts notes that lived outside the repository (spelt in
# pieces, so that this file does not match itself).
OUTSIDE_REFERENCES = ("../" + "shared", "shared/" + "DESIGN" + ".md", "reference/" + "FACTS" + ".md")


def tracked_files() -> list[Path]:
    """Every file git tracks in this checkout (plus `docs/design.md`, committed or not)."""
    # A checkout is what CI and users run the tests from; outside one this fails rather than skips.
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = {ROOT / name for name in listed.decode("utf-8").split("\0") if name}
    return sorted(files | {DESIGN})


def test_no_tracked_file_cites_documents_outside_the_repository():
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue  # deleted in the work tree, not yet in the index
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for lineno, line in enumerate(text.splitlines(), 1):
            for ref in OUTSIDE_REFERENCES:
                if ref in line:
                    found.append(f"{path.relative_to(ROOT)}:{lineno}: {ref}")
    assert not found, "cite docs/design.md instead:\n" + "\n".join(found)


def test_the_design_names_every_stage():
    assert DESIGN.is_file(), "docs/design.md is missing"
    text = DESIGN.read_text(encoding="utf-8")
    missing = [name for name in stage_names() if not re.search(rf"`{re.escape(name)}`", text)]
    assert not missing, f"docs/design.md does not name these stages (as `name`): {missing}"


def test_the_repository_tracks_no_link_and_nothing_it_ignores():
    """A tracked symlink is a path of the machine it was committed on; one where an ignored environment
    lives (`.cache`, `.vllm-venv`) made checking it out delete that environment and leave a link to
    itself. A tracked file that `.gitignore` matches is one a clean clone would not have built."""
    listed = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    links = [entry.split("\t", 1)[1] for entry in listed.decode("utf-8").split("\0") if entry.startswith("120000 ")]
    ignored = subprocess.run(["git", "ls-files", "-c", "-i", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode("utf-8").split("\0")
    assert not links, f"tracked symlinks: {links}"
    assert not [name for name in ignored if name], f"tracked files .gitignore matches: {ignored}"
