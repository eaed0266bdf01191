"""`dataset=files`: local files as a dataset in one line, each file's schema detected from its first records."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.cli import check_config
from eagle3.data.adapters import ADAPTERS, AdapterError, convert, resolve_columns
from eagle3.data.detect import SchemaError, check_schema, detect_schema
from tests.conftest import FIXTURES, compose_config, job_settings

RAW = FIXTURES / "raw"

#: Every raw fixture -> the schema its first records show.
EXPECTED = {
    "bad_sharegpt.jsonl": "sharegpt",  # torn lines and a non-object among its first records
    "deepswe.jsonl": "deepswe_trajectories",
    "glaive.jsonl": "glaive_function_calling",
    "kimik25_2000x.jsonl": "problem_solution",
    "nemotron.jsonl": "openai_messages",
    "opencodeinstruct.jsonl": "opencodeinstruct",
    "openthoughts.jsonl": "sharegpt",
    "perfectblend.jsonl": "sharegpt",
    "sharegpt.jsonl": "sharegpt",
    "ultrachat.jsonl": "openai_messages",
}
#: One fixture per schema, for the checks that run an adapter.
FIXTURE_OF = {"openai_messages": "nemotron.jsonl", "sharegpt": "sharegpt.jsonl",
              "opencodeinstruct": "opencodeinstruct.jsonl", "problem_solution": "kimik25_2000x.jsonl",
              "glaive_function_calling": "glaive.jsonl", "deepswe_trajectories": "deepswe.jsonl"}


def records(name: str) -> list[dict]:
    """The fixture's readable records (bad_sharegpt.jsonl has torn lines on purpose)."""
    out = []
    for line in (RAW / name).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return [r for r in out if isinstance(r, dict)]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def files_cfg(*files, overrides: tuple[str, ...] = ()):
    listed = ",".join(str(f) for f in files)
    return compose_config(["dataset=files", f"dataset.files=[{listed}]", *overrides])


# ----------------------------------------------------------------------------- detection
def test_every_fixture_and_every_schema_is_covered():
    assert set(EXPECTED) == {p.name for p in RAW.glob("*.jsonl")}
    assert set(EXPECTED.values()) == set(ADAPTERS) == set(FIXTURE_OF)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_schema_detected_on_every_adapter_fixture(name):
    found = detect_schema(RAW / name)
    assert found.schema == EXPECTED[name]
    assert found.columns == {}  # every fixture has the adapter's own column names
    assert set(found.keys) >= set(records(name)[0])


@pytest.mark.parametrize("schema", sorted(ADAPTERS))
def test_required_columns_are_the_ones_the_adapter_cannot_do_without(schema):
    """Detection decides by the columns each adapter declares required: the declaration must be true."""
    adapter = ADAPTERS[schema]
    record = records(FIXTURE_OF[schema])[0]
    cols = resolve_columns(schema, None)
    assert adapter.required, schema
    for key in adapter.required:
        with pytest.raises(AdapterError, match=repr(cols[key])):
            convert(schema, {k: v for k, v in record.items() if k != cols[key]}, cols)
    for key in set(adapter.columns) - set(adapter.required):
        convert(schema, {k: v for k, v in record.items() if k != cols[key]}, cols)  # optional: still converts


def test_parquet_json_array_and_gzip_versions_are_detected(tmp_path):
    rows = records("sharegpt.jsonl")
    array = tmp_path / "s.json"
    array.write_text(json.dumps(rows, indent=1))
    gz = tmp_path / "s.jsonl.gz"
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    for path in (write_parquet(tmp_path / "s.parquet", rows), array, gz):
        assert detect_schema(path).schema == "sharegpt", path
    # Parquet gives every row every column, null where a record had none: null is absent to detection.
    msgs = records("ultrachat.jsonl") * 4
    later = {**msgs[0], "conversations": [{"from": "human", "value": "past the first records"}]}
    assert detect_schema(write_parquet(tmp_path / "u.parquet", [*msgs, later])).schema == "openai_messages"


def test_a_json_array_is_read_only_as_far_as_its_first_records(tmp_path):
    rows = records("kimik25_2000x.jsonl") * 8
    text = json.dumps(rows)
    path = tmp_path / "big.json"
    path.write_text(text[: len(text) // 2 + 7] + " <cut off: the rest of a multi-GB file>")
    assert detect_schema(path).schema == "problem_solution"


def test_prompt_response_columns_are_detected_as_a_column_remap(tmp_path):
    path = write_jsonl(tmp_path / "pr.jsonl", [{"prompt": "Say hi.", "response": "Hi."}])
    found = detect_schema(path)
    assert (found.schema, found.columns) == ("opencodeinstruct", {"prompt": "prompt", "response": "response"})


def test_a_file_it_cannot_place_is_one_line_naming_the_file_and_its_keys(tmp_path):
    path = write_jsonl(tmp_path / "weird.jsonl", [{"question": "q?", "answer": "a", "id": 1}])
    with pytest.raises(SchemaError) as exc:
        detect_schema(path)
    text = str(exc.value)
    assert "\n" not in text and str(path) in text and "keys: answer, id, question" in text
    assert "dataset.schema=" in text and all(s in text for s in ADAPTERS)


def test_a_file_two_schemas_fit_is_ambiguous(tmp_path):
    path = write_jsonl(tmp_path / "both.jsonl", [{"messages": [{"role": "user", "content": "a"}],
                                                   "conversations": [{"from": "human", "value": "a"}]}])
    with pytest.raises(SchemaError, match=r"both\.jsonl: ambiguous: .*fit openai_messages.*sharegpt.*dataset\.schema="):
        detect_schema(path)


def broken_first(tmp_path: Path, name: str = "chat.jsonl") -> Path:
    """Chat records with a null `messages` first and one with none at all, as a line 11 would have them."""
    good = [{"id": f"m{i}", "messages": [{"role": "user", "content": f"Question {i}?"},
                                         {"role": "assistant", "content": f"Answer {i}."}]} for i in range(6)]
    return write_jsonl(tmp_path / name, [{"id": "null", "messages": None}, good[0], {"id": "none"}, *good[1:]])


def test_records_no_schema_fits_are_left_out_of_detection(tmp_path):
    """A broken record among the first 8 is one prep reject, as it would be at line 11: not a refused file."""
    path = broken_first(tmp_path)
    found = detect_schema(path)
    assert (found.schema, found.columns, found.keys) == ("openai_messages", {}, ("id", "messages"))
    assert check_schema(path, "openai_messages", None).schema == "openai_messages"
    cfg = files_cfg(path, overrides=("dataset.track=target_native", "dataset.schema=openai_messages"))
    assert job_settings(cfg).dataset.sources["chat"].schema == "openai_messages"
    # When no record fits anything, detection still refuses, naming the keys; so does a given schema.
    nulls = write_jsonl(tmp_path / "nulls.jsonl", [{"id": "a", "messages": None}, {"id": "b"}])
    with pytest.raises(SchemaError, match=r"nulls\.jsonl: no schema's columns are all in its first records "
                                          r"\(keys: id, messages\)"):
        detect_schema(nulls)
    with pytest.raises(SchemaError) as exc:
        check_schema(nulls, "openai_messages", None)
    assert str(exc.value).startswith(f"{nulls}: schema openai_messages needs column 'messages' but it is absent or "
                                     "null in each of its first records (keys: id, messages); valid: ")


def test_a_given_schema_needs_one_fitting_record_and_names_the_column_missing_most(tmp_path):
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{"input": "q"}, {"output": "a"}, {"output": "b"}])
    with pytest.raises(SchemaError, match=r"schema opencodeinstruct needs column 'input' but it is absent or null in "
                                          r"2 of its first 3 records, and none has all of input, output \(keys: "
                                          r"input, output\)"):
        check_schema(mixed, "opencodeinstruct", None)
    one = write_jsonl(tmp_path / "one.jsonl", [{"input": "q"}, {"input": "q2", "output": "a2"}])
    assert check_schema(one, "opencodeinstruct", None).schema == "opencodeinstruct"


# ----------------------------------------------------------------------------- files -> sources
def test_each_file_becomes_a_source_with_its_detected_schema(tmp_path, caplog):
    other = tmp_path / "other"
    other.mkdir()
    a = write_jsonl(tmp_path / "my data.v2.jsonl", records("ultrachat.jsonl"))
    b = write_jsonl(other / "my data.v2.jsonl", records("glaive.jsonl"))
    with caplog.at_level("INFO", logger="eagle3"):
        sources = job_settings(files_cfg(a, b, overrides=("dataset.track=prompt_only", "dataset.num_samples=5"))
                               ).dataset.sources
    assert list(sources) == ["my_data_v2", "my_data_v2_2"]
    assert [sources[n].schema for n in sources] == ["openai_messages", "glaive_function_calling"]
    assert [list(sources[n].data_files) for n in sources] == [[str(a)], [str(b)]]
    assert {(s.track, s.num_samples, s.thinking) for s in sources.values()} == {("prompt_only", 5, True)}
    assert f"dataset=files: {a} -> source my_data_v2, schema openai_messages (keys: messages, prompt, " \
           "prompt_id)" in caplog.text


def test_explicit_schema_skips_detection(tmp_path):
    path = write_jsonl(tmp_path / "both.jsonl", [{"messages": [{"role": "user", "content": "a"}],
                                                   "conversations": [{"from": "human", "value": "a"}]}])
    cfg = files_cfg(path, overrides=("dataset.track=target_native", "dataset.schema=sharegpt"))
    assert job_settings(cfg).dataset.sources["both"].schema == "sharegpt"


def test_explicit_schema_and_columns_are_checked_against_the_first_records(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"q": "Why?", "a": "Because."}])
    ok = files_cfg(path, overrides=("dataset.track=target_native", "dataset.schema=opencodeinstruct",
                                    "+dataset.columns.prompt=q", "+dataset.columns.response=a"))
    assert job_settings(ok).dataset.sources["qa"].columns == {"prompt": "q", "response": "a"}
    [line] = check_config(files_cfg(path, overrides=("dataset.track=target_native", "dataset.schema=sharegpt")))
    assert line.startswith(f"dataset.files: '{path}' -- ") and "schema sharegpt needs column 'conversations'" in line
    assert "keys: a, q" in line


def test_files_add_to_another_datasets_sources(tmp_path):
    path = write_jsonl(tmp_path / "extra.jsonl", records("sharegpt.jsonl"))
    cfg = compose_config(["dataset=demo", f"dataset.files=[{path}]", "dataset.track=prompt_only"])
    assert list(job_settings(cfg).dataset.sources) == ["demo_native", "demo_prompts", "extra"]


@pytest.mark.parametrize("case", ["missing", "suffix", "empty", "unreadable", "unknown", "twice", "no_track",
                                  "bad_track", "bad_schema", "columns_without_schema", "no_files"])
def test_every_files_mistake_is_one_line_naming_the_key(tmp_path, case):
    good = write_jsonl(tmp_path / "good.jsonl", records("sharegpt.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    files, extra = [good], ["dataset.track=target_native"]
    expected = {
        "missing": (tmp_path / "nope.jsonl", "dataset.files: '{p}' -- file not found"),
        "suffix": (tmp_path / "good.csv", "dataset.files: '{p}' -- unsupported file type; valid: .jsonl, "),
        "empty": (empty, "dataset.files: '{p}' -- the file has no records"),
        "unreadable": (write_jsonl(tmp_path / "torn.jsonl", ["not an object"]),
                       "dataset.files: '{p}' -- none of its first records is readable ("),
        "unknown": (write_jsonl(tmp_path / "odd.jsonl", [{"text": "x"}]),
                    "dataset.files: '{p}' -- no schema's columns are all in its first records (keys: text)"),
        "twice": (good, "dataset.files: '{p}' -- listed twice"),
    }
    if case in expected:
        path, want = expected[case]
        (tmp_path / "good.csv").write_text("a,b\n")
        files.append(path)
        want = want.format(p=path)
    elif case == "no_track":
        extra, want = [], "dataset.track: null -- dataset.files needs the track of its files; valid: " \
                          "target_native, prompt_only"
    elif case == "bad_track":
        extra, want = ["dataset.track=native"], "dataset.track: 'native' -- not a known choice; valid: target_native"
    elif case == "bad_schema":
        extra.append("dataset.schema=chatml")
        want = "dataset.schema: 'chatml' -- not a known choice; valid: openai_messages, sharegpt"
    elif case == "columns_without_schema":
        extra.append("+dataset.columns.prompt=q")
        want = "dataset.columns: {\"prompt\": \"q\"} -- renames the columns of one schema: give dataset.schema too"
    else:
        files, want = [], "dataset.files: [] -- names no file; valid: dataset.files=[a.jsonl,b.parquet]"
    errors = check_config(files_cfg(*files, overrides=tuple(extra)))
    assert len(errors) == 1 and errors[0].startswith(want), errors


# ----------------------------------------------------------------------------- the entrypoint
def test_cli_prep_on_files_in_one_line(cli, tmp_path):
    """A relative path is taken from the directory the job runs from, and stored absolute."""
    workdir = tmp_path / "elsewhere"  # the cli fixture's working directory
    write_jsonl(workdir / "a.jsonl", records("sharegpt.jsonl"))
    b = write_parquet(tmp_path / "b.parquet", records("kimik25_2000x.jsonl"))
    root = tmp_path / "artifacts"
    result = cli("stage=prep", "dataset=files", f"dataset.files=[a.jsonl,{b}]", "dataset.track=target_native",
                 root=root)
    assert result.returncode == 0, result.stderr
    log = result.stdout + result.stderr
    assert log.count("dataset=files: a.jsonl -> source a, schema sharegpt (keys: conversations, id)") == 1
    assert log.count(f"dataset=files: {b} -> source b, schema problem_solution (keys: problem, solution, "
                     "thinking)") == 1
    units = {Manifest.load(d).name: Manifest.load(d) for d in (root / "prep").iterdir()}
    assert set(units) == {"a", "b"}
    assert units["a"].config["source"]["data_files"] == [str(workdir / "a.jsonl")]
    assert (units["a"].counts["in"], units["a"].counts["out"]) == (3, 3)
    assert (units["b"].counts["in"], units["b"].counts["out"]) == (2, 2)
    rows = list(read_jsonl(units["b"].dir / "conversations.jsonl"))
    assert {r["track"] for r in rows} == {"target_native"} and rows[0]["messages"][-1]["role"] == "assistant"


def test_cli_prep_rejects_a_broken_first_record_and_keeps_the_rest(cli, tmp_path):
    path = broken_first(tmp_path)
    root = tmp_path / "artifacts"
    result = cli("stage=prep", "dataset=files", f"dataset.files=[{path}]", "dataset.track=target_native", root=root)
    assert result.returncode == 0, result.stderr
    [unit] = [Manifest.load(d) for d in (root / "prep").iterdir()]
    counts = unit.counts
    assert unit.status == "complete" and (counts["in"], counts["out"]) == (8, 6)
    assert counts["in"] == counts["out"] + sum(counts["rejected"].values())
    rejects = {r["id"]: r for r in read_jsonl(unit.dir / "rejects.jsonl")}
    assert {rid: (r["reason"], r["where"]) for rid, r in rejects.items()} == {
        "chat:null": ("adapter_error", f"{path}:1"), "chat:none": ("adapter_error", f"{path}:3")}
    assert "missing column 'messages'" in rejects["chat:null"]["detail"]
    assert sorted(r["meta"]["raw_id"] for r in read_jsonl(unit.dir / "conversations.jsonl")) == \
        [f"m{i}" for i in range(6)]


def test_cli_files_mistakes_exit_2_before_any_stage(cli, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"question": "q?", "answer": "a"}])
    (tmp_path / "x.txt").write_text("{}\n")
    root = tmp_path / "artifacts"
    result = cli("stage=prep", "dataset=files", f"dataset.files=[{tmp_path}/nope.jsonl,{tmp_path}/x.txt,{empty},{odd}]",
                 root=root)
    assert result.returncode == 2, result.stderr
    lines = [line.strip() for line in result.stderr.splitlines() if line.startswith("  ")]
    assert lines == [
        "dataset.track: null -- dataset.files needs the track of its files; valid: target_native, prompt_only",
        f"dataset.files: '{tmp_path}/nope.jsonl' -- file not found; valid: local .jsonl, .jsonl.gz, .json, "
        ".json.gz, .parquet files",
        f"dataset.files: '{tmp_path}/x.txt' -- unsupported file type; valid: .jsonl, .jsonl.gz, .json, .json.gz, "
        ".parquet",
        f"dataset.files: '{empty}' -- the file has no records; valid: a file with at least one record",
        next(line for line in lines if line.startswith(f"dataset.files: '{odd}' -- no schema's columns")),
    ]
    assert "keys: answer, question" in lines[4] and "Traceback" not in result.stderr
    assert not (root / "prep").exists()
