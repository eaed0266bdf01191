"""Stage prep: rejects with reasons, tracks, filters, dedupe, nested sampling, loading, CLI runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.cli import check_config
from eagle3.config.schema import DatasetSourceConfig
from eagle3.data.selection import sampling_key
from eagle3.errors import NothingKept
from eagle3.stages import StageContext
from eagle3.stages.prep import PREP
from tests.conftest import FIXTURES, compose_config, compose_settings, job_settings

RAW = FIXTURES / "raw"


def make_cfg(tmp_path: Path, overrides: tuple[str, ...] = (), **sources: dict):
    """The composed root config with `sources` as the dataset (each a DatasetSourceConfig's fields)."""
    cfg = compose_config([f"paths.root={tmp_path / 'art'}", *overrides])
    cfg.dataset.sources = {name: DatasetSourceConfig(**spec) for name, spec in sources.items()}
    return job_settings(cfg)


def run_prep(cfg, tmp_path: Path) -> dict[str, Manifest]:
    ctx = StageContext(root=Path(cfg.paths.root), run_dir=tmp_path)
    return {m.name: m for m in PREP(cfg, ctx)}


def outputs(manifest: Manifest) -> list[dict]:
    return list(read_jsonl(manifest.dir / "conversations.jsonl"))


def rejects(manifest: Manifest) -> dict[str, dict]:
    return {r["id"]: r for r in read_jsonl(manifest.dir / "rejects.jsonl")}


def reconciles(manifest: Manifest) -> bool:
    counts = manifest.counts
    return manifest.status == "complete" and counts["in"] == counts["out"] + sum(counts["rejected"].values())


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def qa_rows(n: int, prefix: str = "q") -> list[dict]:
    return [{"id": f"{prefix}{i}", "conversations": [{"from": "human", "value": f"Question number {i}?"},
                                                      {"from": "gpt", "value": f"Answer {i}."}]} for i in range(n)]


def test_bad_records_are_rejected_with_reasons_and_the_job_goes_on(tmp_path):
    path = str(RAW / "bad_sharegpt.jsonl")
    cfg = make_cfg(tmp_path, bad={"track": "prompt_only", "schema": "sharegpt", "data_files": [path]})
    m = run_prep(cfg, tmp_path)["bad"]
    assert reconciles(m) and m.counts["in"] == 13 and m.counts["out"] == 3
    got = {rid: r["reason"] for rid, r in rejects(m).items()}
    kept, dropped = sorted(["bad:g1", "bad:g2"], key=lambda rid: sampling_key(0, rid))
    assert got == {
        "bad:no_role": "missing_role",
        "bad:odd_role": "unknown_role",
        f"bad:{path}:4": "malformed_json",  # torn line in the middle: reading went on after it
        "bad:empty": "empty_content",
        "bad:number": "non_string_content",
        "bad:gpt_first": "assistant_first",
        f"bad:{path}:8": "malformed_json",  # valid JSON, but not an object
        "bad:g1#2": "duplicate_id",
        "bad:no_convs": "adapter_error",
        dropped: "duplicate_prompt",  # "First good question?" vs "  first GOOD   question? "
    }
    assert m.counts["rejected"] == {"adapter_error": 1, "assistant_first": 1, "duplicate_id": 1,
                                    "duplicate_prompt": 1, "empty_content": 1, "malformed_json": 2,
                                    "missing_role": 1, "non_string_content": 1, "unknown_role": 1}
    details = rejects(m)
    assert details[f"bad:{path}:4"]["detail"].startswith(f"{path}:4: malformed JSON")
    assert "missing column 'conversations'" in details["bad:no_convs"]["detail"]
    assert details[dropped]["detail"].startswith(f"same normalized prompt as {kept}")
    assert details["bad:g1#2"]["where"] == f"{path}:10"
    kept_records = {r["id"]: r for r in outputs(m)}
    assert sorted(kept_records) == sorted([kept, "bad:g3", "bad:dangling"])
    # A conversation ending in an unanswered question is what prompt-only exists to answer: both
    # questions are kept (the answer between them is dropped, the target writes its own).
    assert [m["content"] for m in kept_records["bad:dangling"]["messages"]] == ["Q1?", "Q2?"]


def test_a_file_of_questions_is_prompt_only_input_and_target_native_refuses_it(tmp_path):
    path = write_jsonl(tmp_path / "questions.jsonl", [
        {"id": "q1", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
        {"id": "q2", "messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Name a prime number."}]},
        {"id": "q3", "messages": [{"role": "system", "content": "Only a system turn."}]},
        {"id": "q4", "messages": [{"role": "user", "content": "Answered?"}, {"role": "assistant", "content": "Yes."}]},
    ])
    cfg = make_cfg(tmp_path, po={"track": "prompt_only", "schema": "openai_messages", "data_files": [path]},
                   tn={"track": "target_native", "schema": "openai_messages", "data_files": [path]})
    manifests = run_prep(cfg, tmp_path)
    po, tn = manifests["po"], manifests["tn"]
    assert reconciles(po) and sorted(r["id"] for r in outputs(po)) == ["po:q1", "po:q2", "po:q4"]
    assert {rid: r["reason"] for rid, r in rejects(po).items()} == {"po:q3": "too_few_turns"}
    q2 = next(r for r in outputs(po) if r["id"] == "po:q2")
    assert q2["messages"] == [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Name a prime number."}]
    assert {rid: r["reason"] for rid, r in rejects(tn).items()} == {
        "tn:q1": "user_last", "tn:q2": "user_last", "tn:q3": "too_few_turns"}
    assert [r["id"] for r in outputs(tn)] == ["tn:q4"]


def test_prompt_only_drops_answers_and_tool_results_but_keeps_tools(tmp_path):
    path = str(RAW / "nemotron.jsonl")
    cfg = make_cfg(tmp_path, po={"track": "prompt_only", "schema": "openai_messages", "data_files": [path]},
                   tn={"track": "target_native", "schema": "openai_messages", "data_files": [path]})
    manifests = run_prep(cfg, tmp_path)
    po = {r["meta"]["raw_id"]: r for r in outputs(manifests["po"])}
    tn = {r["meta"]["raw_id"]: r for r in outputs(manifests["tn"])}
    assert po["nm-002"]["messages"] == [{"role": "user", "content": "What's the weather in Paris?"}]
    assert po["nm-002"]["tools"][0]["function"]["name"] == "get_weather"
    assert po["nm-002"]["meta"]["dropped_assistant_turns"] == 2
    assert po["nm-002"]["meta"]["dropped_tool_results"] == 1
    assert po["nm-002"]["track"] == "prompt_only" and po["nm-002"]["source"] == "po"
    assert po["nm-001"]["meta"]["dropped_assistant_turns"] == 1
    assert [m["role"] for m in tn["nm-002"]["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert tn["nm-002"]["meta"]["dropped_assistant_turns"] == 0
    assert tn["nm-001"]["messages"][1]["reasoning_content"].startswith("17 * 23 = 17 * 20")
    assert all(reconciles(m) for m in manifests.values())


@pytest.mark.parametrize("override, reason, rejected_ids", [
    ("prep.min_user_turns=2", "too_few_turns", {"QWJhYvA_1", "QWJhYvA_2"}),
    ("prep.max_user_turns=1", "too_many_turns", {"QWJhYvA_0"}),
    ("prep.max_chars=40", "too_long", {"QWJhYvA_0"}),
])
def test_prep_filters(tmp_path, override, reason, rejected_ids):
    cfg = make_cfg(tmp_path, (override,),
                   s={"track": "prompt_only", "schema": "sharegpt", "data_files": [str(RAW / "sharegpt.jsonl")]})
    m = run_prep(cfg, tmp_path)["s"]
    assert {rid.split(":", 1)[1] for rid, r in rejects(m).items() if r["reason"] == reason} == rejected_ids
    assert m.counts["rejected"] == {reason: len(rejected_ids)} and reconciles(m)


def test_sampling_is_seeded_nested_and_in_key_order(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(40))
    runs = {}
    cfg = make_cfg(tmp_path, nest={"track": "prompt_only", "schema": "sharegpt", "data_files": [path]})
    for n in (5, 15, None):
        cfg.dataset.sources["nest"].num_samples = n
        runs[n] = run_prep(cfg, tmp_path)["nest"]
    ids = {n: [r["id"] for r in outputs(m)] for n, m in runs.items()}
    assert len(ids[5]) == 5 and len(ids[15]) == 15 and len(ids[None]) == 40
    assert ids[15][:5] == ids[5] and ids[None][:15] == ids[15]
    assert ids[None] == sorted(ids[None], key=lambda rid: sampling_key(0, rid))
    assert runs[5].counts["rejected"] == {"not_sampled": 35} and reconciles(runs[5])
    assert runs[5].extra["available"] == 40
    cfg.data.seed, cfg.dataset.sources["nest"].num_samples = 7, 5
    assert [r["id"] for r in outputs(run_prep(cfg, tmp_path)["nest"])] != ids[5]


def test_dedupe_keeps_the_smallest_key_whatever_the_read_order(tmp_path):
    rows = qa_rows(6)
    for row in rows[3:]:  # q3..q5 repeat q0's prompt in other spellings
        row["conversations"][0]["value"] = " question  NUMBER 0? "
    forward = write_jsonl(tmp_path / "fwd.jsonl", rows)
    backward = write_jsonl(tmp_path / "bwd.jsonl", rows[::-1])
    group = ["d:q0", "d:q3", "d:q4", "d:q5"]
    winners = set()
    cfg = make_cfg(tmp_path, d={"track": "prompt_only", "schema": "sharegpt", "data_files": [forward]})
    for seed in range(3):
        expected = min(group, key=lambda rid: sampling_key(seed, rid))
        winners.add(expected)
        for path in (forward, backward):
            cfg.data.seed = seed
            cfg.dataset.sources["d"].data_files = [path]
            m = run_prep(cfg, tmp_path)["d"]
            kept = {r["id"] for r in outputs(m)}
            assert kept == {expected, "d:q1", "d:q2"}
            assert {rid for rid, r in rejects(m).items() if r["reason"] == "duplicate_prompt"} \
                == set(group) - {expected}
    assert len(winners) > 1  # the seeds really exercised different winners
    cfg.prep.dedupe = False
    assert run_prep(cfg, tmp_path)["d"].counts["out"] == 6


def test_json_array_and_parquet_files_read_like_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (RAW / "ultrachat.jsonl").read_text().splitlines()]
    (tmp_path / "u.json").write_text(json.dumps(rows, indent=2))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "u.parquet")
    spec = {"track": "target_native", "schema": "openai_messages"}
    cfg = make_cfg(tmp_path, jl={**spec, "data_files": [str(RAW / "ultrachat.jsonl")]},
                   js={**spec, "data_files": [str(tmp_path / "u.json")]},
                   pq={**spec, "data_files": [str(tmp_path / "u.parquet")]})
    manifests = run_prep(cfg, tmp_path)
    strip = [sorted(({k: v for k, v in r.items() if k not in ("id", "source")} for r in outputs(manifests[u])),
                    key=lambda r: r["meta"]["raw_id"]) for u in ("jl", "js", "pq")]
    assert strip[0] == strip[1] == strip[2] and len(strip[0]) == 2
    (tmp_path / "broken.json").write_text('[{"a": 1},\n  {"b": ]')
    cfg = make_cfg(tmp_path, br={**spec, "data_files": [str(tmp_path / "broken.json")]})
    with pytest.raises(NothingKept, match="0 of 1 records kept; rejected 1: malformed_json 1"):
        run_prep(cfg, tmp_path)  # an unreadable file keeps nothing: prep stops (tests/unit/stages/test_intake.py)
    m = Manifest.load(PREP.locate(cfg, StageContext(root=Path(cfg.paths.root), run_dir=tmp_path), "br")[0])
    assert m.status == "stopped" and m.counts == {"in": 1, "out": 0, "rejected": {"malformed_json": 1}}


def test_record_that_json_cannot_hold_is_rejected_not_fatal(tmp_path):
    path = tmp_path / "nan.jsonl"
    path.write_text('{"id": "a", "meta": {"score": NaN}, "conversations": [{"from": "human", "value": "q"}, '
                    '{"from": "gpt", "value": "a"}]}\n' + json.dumps(qa_rows(1)[0]) + "\n")
    cfg = make_cfg(tmp_path, n={"track": "prompt_only", "schema": "sharegpt", "data_files": [str(path)]})
    m = run_prep(cfg, tmp_path)["n"]
    assert m.counts["rejected"] == {"adapter_error": 1} and m.counts["out"] == 1 and reconciles(m)
    assert "JSON" in rejects(m)["n:a"]["detail"]


def test_lone_surrogate_escapes_are_rejected_and_a_rerun_completes(tmp_path):
    """JSON may escape half a UTF-16 pair (`\\ud800`); UTF-8 cannot hold it, and writing it crashed prep."""
    path = tmp_path / "surrogates.jsonl"
    rows = qa_rows(3)
    lines = [json.dumps(r) for r in rows]
    lines[0] = lines[0].replace('"q0"', '"q0\\ud800"')  # in the id
    lines[1] = lines[1].replace("Question number 1?", "Question \\udc00 number 1?")  # in the text
    path.write_text("\n".join(lines) + "\n")
    cfg = make_cfg(tmp_path, s={"track": "prompt_only", "schema": "sharegpt", "data_files": [str(path)]})
    m = run_prep(cfg, tmp_path)["s"]
    assert m.counts["rejected"] == {"invalid_unicode": 2} and m.counts["out"] == 1 and reconciles(m)
    assert [r["id"] for r in outputs(m)] == ["s:q2"]
    found = rejects(m)
    assert "id (character 2) holds a lone UTF-16 surrogate" in found[f"s:{path}:1"]["detail"]
    assert "conversations[0].value" in found[f"s:{path}:2"]["detail"]
    assert run_prep(cfg, tmp_path)["s"].counts == m.counts  # the rerun reuses it


def test_hub_source_goes_through_load_dataset_with_plain_args_and_no_token(tmp_path, monkeypatch):
    import datasets

    calls = []
    rows = [json.loads(line) for line in (RAW / "ultrachat.jsonl").read_text().splitlines()]

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return iter(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("eagle3.stages.prep.latest_dataset_commit", lambda hub_id: "9" * 40)  # the hub is offline here
    cfg = compose_settings([f"paths.root={tmp_path / 'art'}", f"paths.hf_cache={tmp_path / 'hf'}", "dataset=ultrachat",
                            "dataset.sources.ultrachat.streaming=true", "dataset.sources.ultrachat.num_samples=1"])
    m = run_prep(cfg, tmp_path)["ultrachat"]
    [(args, kwargs)] = calls
    assert args == ("HuggingFaceH4/ultrachat_200k", None)
    assert kwargs == {"split": "train_sft", "streaming": True, "cache_dir": str(tmp_path / "hf"), "revision": "9" * 40}
    assert type(kwargs["split"]) is str and "token" not in kwargs
    assert m.counts == {"in": 2, "out": 1, "rejected": {"not_sampled": 1}}
    [record] = outputs(m)
    assert record["id"] == min(("ultrachat:a1f3", "ultrachat:b2e4"), key=lambda rid: sampling_key(0, rid))
    assert record["track"] == "prompt_only" and {x["role"] for x in record["messages"]} == {"user"}


def test_unit_config_covers_source_prep_seed_and_file_contents(tmp_path):
    path = tmp_path / "qa.jsonl"
    write_jsonl(path, qa_rows(3))
    cfg = make_cfg(tmp_path, s={"track": "prompt_only", "schema": "sharegpt", "data_files": [str(path)]})
    config = PREP.unit_config(cfg, "s")
    assert set(config) == {"source", "prep", "seed", "format_version", "data_files_sha256"}
    assert config["source"]["schema"] == "sharegpt" and config["prep"]["dedupe"] is True
    assert type(config["source"]) is dict and type(config["prep"]) is dict
    ctx = StageContext(root=tmp_path / "art", run_dir=tmp_path)
    before = PREP.locate(cfg, ctx, "s")[0]
    write_jsonl(path, qa_rows(4))
    assert PREP.locate(cfg, ctx, "s")[0] != before  # edited file -> new output, never stale reuse


def test_a_killed_run_is_redone_to_the_same_result(tmp_path, monkeypatch):
    from eagle3.data.selection import Selector

    path = str(RAW / "bad_sharegpt.jsonl")
    spec = {"track": "prompt_only", "schema": "sharegpt", "data_files": [path]}
    clean = run_prep(make_cfg(tmp_path / "clean", bad=spec), tmp_path)["bad"]

    original, n_reads = Selector.read, []

    def dying_read(self, index):
        n_reads.append(index)
        if len(n_reads) == 2:
            raise KeyboardInterrupt("killed")
        return original(self, index)

    monkeypatch.setattr(Selector, "read", dying_read)
    cfg = make_cfg(tmp_path, bad=spec)
    with pytest.raises(KeyboardInterrupt):
        run_prep(cfg, tmp_path)
    where, manifest = PREP.locate(cfg, StageContext(root=tmp_path / "art", run_dir=tmp_path), "bad")
    assert manifest is None and not (where / "conversations.jsonl").exists()  # complete-or-absent
    monkeypatch.setattr(Selector, "read", original)
    redone = run_prep(cfg, tmp_path)["bad"]
    assert reconciles(redone) and redone.counts == clean.counts
    assert outputs(redone) == outputs(clean) and rejects(redone) == rejects(clean)
    assert not [p.name for p in redone.dir.iterdir() if p.name.startswith(".")]  # no spill left


def test_unknown_column_and_file_type_are_config_errors(tmp_path):
    bad_file = tmp_path / "data.csv"
    bad_file.write_text("a,b\n")
    cfg = compose_config(["dataset=opencodeinstruct", "+dataset.sources.opencodeinstruct.columns.answer=output"])
    assert check_config(cfg) == [
        "dataset.sources.opencodeinstruct.columns.answer: 'output' -- not a column key of schema "
        "opencodeinstruct; valid: id, prompt, response"]
    cfg = compose_config(["dataset=sharegpt", "dataset.sources.sharegpt.hub_id=null",
                          f"dataset.sources.sharegpt.data_files=[{bad_file}]"])
    [error] = check_config(cfg)
    assert error.startswith("dataset.sources.sharegpt.data_files: ") and "unsupported file type" in error


def test_cli_prep_on_local_files(cli, tmp_path):
    root = tmp_path / "artifacts"
    args = ("stage=prep", "dataset=glaive_fc", "dataset.sources.glaive_fc.hub_id=null",
            f"dataset.sources.glaive_fc.data_files=[{RAW / 'glaive.jsonl'},{RAW / 'bad_sharegpt.jsonl'}]")
    result = cli(*args, root=root)
    assert result.returncode == 0, result.stderr
    [unit] = list((root / "prep").iterdir())
    m = Manifest.load(unit)
    # The sharegpt-shaped file is wrong for this schema: each of its records is rejected, none lost.
    assert m.counts["rejected"] == {"adapter_error": 10, "duplicate_id": 1, "malformed_json": 2}
    assert reconciles(m) and m.counts["in"] == 15 and m.counts["out"] == 2
    first = next(r for r in outputs(m) if r["tools"])
    assert first["messages"][-1]["content"] == "Great, thanks!" and first["track"] == "prompt_only"
    assert "[prep] glaive_fc" in result.stdout + result.stderr


def test_cli_prep_needs_demo_data_then_reads_it(cli, tmp_path):
    root = tmp_path / "artifacts"
    args = ("dataset=demo_prompts", "dataset.sources.demo_prompts.num_samples=12")
    early = cli("stage=prep", *args, root=root)
    assert early.returncode == 3
    assert "no complete demo_data output for 'demo_prompts'" in early.stderr
    assert "run stage=demo_data first" in early.stderr and "Traceback" not in early.stderr
    assert cli("stage=demo_data", *args, root=root).returncode == 0
    result = cli("stage=prep", *args, root=root)
    assert result.returncode == 0, result.stderr
    [unit] = list((root / "prep").iterdir())
    m = Manifest.load(unit)
    demo = Manifest.load(next((root / "demo_data").iterdir()))
    assert m.counts["in"] == demo.counts["out"] and reconciles(m)
    assert m.inputs["raw"]["fingerprint"] == demo.fingerprint
    rows = outputs(m)
    assert len(rows) == m.counts["out"] > 0
    assert all(r["id"].startswith("demo_prompts:") and r["track"] == "prompt_only" for r in rows)
    assert all({x["role"] for x in r["messages"]} <= {"system", "user"} for r in rows)
    assert all(r["meta"]["dropped_assistant_turns"] == r["meta"]["user_turns"] for r in rows)


def test_a_demo_native_source_is_keyed_by_its_answering_target_not_where_it_lies(tmp_path):
    """A checkout elsewhere (the demo target at another path) reuses the chain; another target does not."""
    import shutil

    from eagle3.paths import asset_path
    from eagle3.stages.demo_data import DEMO_DATA

    copy = tmp_path / "elsewhere" / "demo_target"
    shutil.copytree(asset_path("demo_target"), copy)
    here = compose_settings(["dataset=demo_native"])
    there = compose_settings(["dataset=demo_native", f"dataset.sources.demo_native.answered_by={copy}"])
    assert PREP.unit_config(there, "demo_native") == PREP.unit_config(here, "demo_native")
    assert DEMO_DATA.unit_config(there, "demo_native") == DEMO_DATA.unit_config(here, "demo_native")
    (copy / "config.json").write_text((copy / "config.json").read_text().replace('"rms_norm_eps"', '"rms_norm_eps" '))
    assert DEMO_DATA.unit_config(there, "demo_native") != DEMO_DATA.unit_config(here, "demo_native")
