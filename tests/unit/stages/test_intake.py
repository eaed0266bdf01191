"""Stop where the data dies (issue 22): a stage that keeps none of a unit's records ends the job there.

In one line on stderr, exit code 3: the counts, the top reject reasons, one reject's `file:line` and
detail, and where every reject is -- not three stages later with advice about something else. A
source that loses most (more than `data.warn_reject_fraction`) of its records but keeps some gets a
WARNING line beside its stage summary. The CLI cases run the entrypoint (demo target, a few records,
no server); the rest run stage `prep` in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, StageOutput, read_jsonl
from eagle3.cli import check_config
from eagle3.errors import EXIT_STAGE_ERROR, NothingKept
from eagle3.stages import MissingInput, StageContext
from eagle3.stages.intake import empty_inputs
from eagle3.stages.prep import PREP
from eagle3.sweeps.jobs import JOB_FILE
from tests.conftest import compose_config, job_settings

ANSWER_FIRST = "message 0 answers before any user turn"  # eagle3.data.conversation's assistant_first detail


def write_chats(path: Path, n: int, answer_first: int = 0) -> Path:
    """`n` OpenAI-style chats; the first `answer_first` open with an assistant turn (an `assistant_first` reject)."""
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            messages = [{"role": "user", "content": f"What is {i} plus {i}?"},
                        {"role": "assistant", "content": f"It is {2 * i}."}]
            if i < answer_first:
                messages.insert(0, {"role": "assistant", "content": f"Hello {i}."})
            fh.write(json.dumps({"id": f"c{i}", "messages": messages}) + "\n")
    return path


def the_line(stderr: str) -> str:
    [line] = [x for x in stderr.splitlines() if x.startswith("eagle3:")]
    return line


def files_cfg(root: Path, *files: Path, overrides: tuple[str, ...] = ()):
    listed = ",".join(str(f) for f in files)
    cfg = compose_config(["dataset=files", f"dataset.files=[{listed}]", "dataset.track=target_native",
                          f"paths.root={root}", *overrides])
    return job_settings(cfg)


def run_prep(cfg, tmp_path: Path) -> dict[str, Manifest]:
    return {m.name: m for m in PREP(cfg, StageContext(root=Path(cfg.paths.root), run_dir=tmp_path))}


def unit_dir(root: Path, stage: str, unit: str) -> Path:
    [found] = (root / stage).glob(f"{unit}-*")
    return found


# ------------------------------------------------------------------ the CLI: exit 3 at the stage that emptied it
def test_every_record_rejected_at_prep_stops_the_chain_at_prep_in_one_line(cli, tmp_path):
    """The issue's case: a prompt-only file prep rejects whole went on through generate and tokenize."""
    data = write_chats(tmp_path / "answers_first.jsonl", 5, answer_first=5)
    root = tmp_path / "artifacts"
    done = cli("stage=all", "dataset=files", f"dataset.files=[{data}]", "dataset.track=prompt_only", root=root)
    assert done.returncode == EXIT_STAGE_ERROR and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = the_line(done.stderr)
    stopped = unit_dir(root, "prep", "answers_first")
    assert line == (f"eagle3: stage=prep source=answers_first: 0 of 5 records kept; rejected 5: assistant_first 5 "
                    f"(e.g. {data}:1: {ANSWER_FIRST}); every reject with its reason: {stopped / 'rejects.jsonl'}. "
                    "Fix the data or the dataset options (dataset.*, prep.*), then rerun.")
    assert "eval_size" not in done.stderr  # the advice of a stage that never ran
    # Nothing downstream ran: no server, no generation, no tokenizer.
    assert {p.name for p in root.iterdir()} == {"prep", "runs", ".locks"}
    # The rejects stay to be read; the unit is not complete, and no empty output looks like one.
    manifest = Manifest.load(stopped)
    assert manifest.status == "stopped" and manifest.counts == {"in": 5, "out": 0, "rejected": {"assistant_first": 5}}
    assert [r["where"] for r in read_jsonl(stopped / "rejects.jsonl")] == [f"{data}:{i}" for i in range(1, 6)]
    assert not (stopped / "conversations.jsonl").exists()
    [run_dir] = (root / "runs").iterdir()
    job = json.loads((run_dir / JOB_FILE).read_text())
    assert job["status"] == "failed" and job["failure"].startswith("prep: stage=prep source=answers_first: 0 of 5")


def test_tokenize_rejecting_every_conversation_stops_at_tokenize(cli, tmp_path):
    """Every conversation longer than data.max_len, dropped (tokenize.overlength=drop): exit 3 at tokenize."""
    data = write_chats(tmp_path / "chats.jsonl", 6)
    root = tmp_path / "artifacts"
    done = cli("stage=all", "dataset=files", f"dataset.files=[{data}]", "dataset.track=target_native",
               "data.max_len=8", "tokenize.overlength=drop", root=root)
    assert done.returncode == EXIT_STAGE_ERROR and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = the_line(done.stderr)
    stopped = unit_dir(root, "tokenize", "chats")
    assert line.startswith("eagle3: stage=tokenize source=chats: 0 of 6 conversations kept; rejected 6: too_long 6 "
                           "(e.g. id 'chats:c"), line
    assert "(rejects.jsonl:1): " in line and " tokens > data.max_len=8); " in line, line
    assert line.endswith(f"every reject with its reason: {stopped / 'rejects.jsonl'}. Fix the data or the tokenize "
                         "options (data.max_len, tokenize.overlength, model.training_chat_template), then rerun.")
    assert Manifest.load(unit_dir(root, "prep", "chats")).status == "complete"
    assert Manifest.load(stopped).status == "stopped"
    assert not (root / "merge").exists()


# ------------------------------------------------------------------ in-process: which units stop, and the rerun
def test_one_empty_source_among_several_stops_prep_after_the_others_are_done(tmp_path):
    good = write_chats(tmp_path / "good.jsonl", 4)
    bad = write_chats(tmp_path / "bad.jsonl", 3, answer_first=3)
    cfg = files_cfg(tmp_path / "art", good, bad)
    with pytest.raises(NothingKept) as stop:
        run_prep(cfg, tmp_path)
    assert stop.value.exit_code == EXIT_STAGE_ERROR
    assert str(stop.value).startswith("stage=prep source=bad: 0 of 3 records kept; rejected 3: assistant_first 3 "
                                      f"(e.g. {bad}:1: {ANSWER_FIRST})")
    assert "source=good" not in str(stop.value)
    # The good source's work is complete and is what the rerun reuses.
    assert Manifest.load(unit_dir(tmp_path / "art", "prep", "good")).status == "complete"


def test_a_stopped_unit_is_started_over_by_the_rerun(tmp_path):
    """Not resumed: its verdicts may be what a fix that keeps the fingerprint (code, the hub's data) changed."""
    bad = write_chats(tmp_path / "bad.jsonl", 3, answer_first=3)
    cfg = files_cfg(tmp_path / "art", bad)
    with pytest.raises(NothingKept):
        run_prep(cfg, tmp_path)
    stopped = unit_dir(tmp_path / "art", "prep", "bad")
    (stopped / "left_by_the_first_run").write_text("")
    with pytest.raises(NothingKept, match="0 of 3 records kept; rejected 3: assistant_first 3"):
        run_prep(cfg, tmp_path)
    assert not (stopped / "left_by_the_first_run").exists()
    assert len(list(read_jsonl(stopped / "rejects.jsonl"))) == 3


def test_the_next_stage_and_the_plan_say_the_unit_stopped_not_that_it_never_ran(tmp_path):
    from eagle3.planning.chain import locate
    from eagle3.stages.generate import GENERATE
    from eagle3.stages.plan import ConfigChain

    bad = write_chats(tmp_path / "bad.jsonl", 3, answer_first=3)
    cfg = files_cfg(tmp_path / "art", bad, overrides=("dataset.track=prompt_only",))
    ctx = StageContext(root=tmp_path / "art", run_dir=tmp_path)
    with pytest.raises(NothingKept):
        PREP(cfg, ctx)
    stopped = unit_dir(tmp_path / "art", "prep", "bad")
    with pytest.raises(MissingInput, match=f"its last run kept none of its input \\(every reject with its reason: "
                       f"{stopped / 'rejects.jsonl'}\\); fix that, then rerun stage=prep"):
        GENERATE(cfg, ctx)  # stage=generate alone: no server is launched for it
    row, _ = locate(ConfigChain(cfg, ctx), "prep", "bad")
    assert row.status == "stopped" and "a rerun starts it over" in row.notes[0]


def test_several_empty_sources_are_one_line_naming_each(tmp_path):
    first = write_chats(tmp_path / "first.jsonl", 2, answer_first=2)
    second = write_chats(tmp_path / "second.jsonl", 3, answer_first=3)
    cfg = files_cfg(tmp_path / "art", first, second)
    with pytest.raises(NothingKept) as stop:
        run_prep(cfg, tmp_path)
    line = str(stop.value)
    assert "\n" not in line and line.startswith("stage=prep: 2 of 2 sources kept nothing -- source=first: 0 of 2 ")
    assert "; source=second: 0 of 3 records kept" in line


# ------------------------------------------------------------------ the loud warning
def test_a_source_losing_most_of_its_records_warns_in_the_stage_summary(tmp_path, caplog):
    mixed = write_chats(tmp_path / "mixed.jsonl", 10, answer_first=6)
    cfg = files_cfg(tmp_path / "art", mixed)
    with caplog.at_level("INFO", logger="eagle3"):
        manifest = run_prep(cfg, tmp_path)["mixed"]
    assert manifest.status == "complete" and manifest.counts["out"] == 4
    [warning] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warning.getMessage() == (
        "[prep] source=mixed lost 60% of its records (6 of 10; data.warn_reject_fraction=0.5): rejected 6: "
        f"assistant_first 6 (e.g. {mixed}:1: {ANSWER_FIRST}); every reject with its reason: "
        f"{manifest.dir / 'rejects.jsonl'}")
    summary = [r.getMessage() for r in caplog.records].index(warning.getMessage()) - 1
    assert caplog.records[summary].getMessage().startswith("[prep] mixed  in=10 out=4")  # right under the summary


@pytest.mark.parametrize("override, n, answer_first", [
    ("data.warn_reject_fraction=0.7", 10, 6),  # 60 % lost is under this threshold
    ("dataset.num_samples=1", 4, 0),           # 3 of 4 not sampled: the config's choice, not a loss
])
def test_no_warning_below_the_fraction_or_for_sampling(tmp_path, caplog, override, n, answer_first):
    data = write_chats(tmp_path / "data.jsonl", n, answer_first=answer_first)
    cfg = files_cfg(tmp_path / "art", data, overrides=(override,))
    with caplog.at_level("INFO", logger="eagle3"):
        run_prep(cfg, tmp_path)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_warn_reject_fraction_is_a_share(value):
    errors = check_config(compose_config([f"data.warn_reject_fraction={value}"]))
    assert errors == [f"data.warn_reject_fraction: {value} -- a share of a source's records; valid: [0, 1] "
                      "(0 = warn on any loss, 1 = never)"]


# ------------------------------------------------------------------ outputs an earlier version completed empty
def test_empty_inputs_name_the_stage_upstream_that_emptied_them(tmp_path):
    """Merge over tokenized sources that an earlier version completed empty says prep emptied them."""
    prep = StageOutput.open(tmp_path, "prep", "a", {"v": 1})
    with prep:
        for i in range(2):
            prep.count_in()
            prep.reject(f"a:r{i}", "assistant_first", ANSWER_FIRST, where=f"/data/a.jsonl:{i + 1}")
        prep.records("conversations.jsonl")
        prep_done = prep.finalize()
    tokenize = StageOutput.open(tmp_path, "tokenize", "a", {"v": 1}, inputs={"conversations": prep_done})
    with tokenize:
        tokenize.records("tokenized_data.jsonl")
        tokenized = tokenize.finalize()
    said = empty_inputs({"tokenized.a": tokenized})
    assert said == (f"nothing to read: stage prep kept 0 of 2 for a (rejected 2: assistant_first 2 (e.g. "
                    f"/data/a.jsonl:1: {ANSWER_FIRST}); every reject with its reason: "
                    f"{prep_done.dir / 'rejects.jsonl'})")
    kept = StageOutput.open(tmp_path, "tokenize", "b", {"v": 1})
    with kept:
        kept.count_in()
        kept.records("tokenized_data.jsonl").write({"id": "b:r0"})
        some = kept.finalize()
    assert empty_inputs({"tokenized.a": tokenized, "tokenized.b": some}) is None  # merge goes on with b
