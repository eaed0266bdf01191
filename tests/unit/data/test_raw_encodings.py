"""Local data files as they arrive: any Unicode encoding read as the same text, a cut-short file one line."""

from __future__ import annotations

import codecs
import gzip
import json
import random
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.config.schema import DatasetSourceConfig
from eagle3.data.detect import SchemaError, detect_schema
from eagle3.data.loading import UnreadableDataFile, head_records, iter_source

#: Text UTF-8 read of a UTF-16 file turns to garbage: Cyrillic, CJK, emoji (a surrogate pair in UTF-16).
TEXTS = ["Сколько будет два плюс два?", "ответ четыре", "你好，世界。これは日本語です。", "Done 🎉🚀 👍🏽 ok"]


def rows(n: int = 6) -> list[dict]:
    return [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"{TEXTS[i % 2 * 2]} #{i}"},
                                              {"from": "gpt", "value": f"{TEXTS[1]} {TEXTS[3]} {i}"}]}
            for i in range(n)]


def jsonl_text(records: list, newline: str = "\n") -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + newline for r in records)


#: name -> (file suffix, text -> bytes as saved). Notepad and PowerShell write "Unicode" as UTF-16 with
#: a BOM and CRLF; exporters write BOM-less UTF-16/32 of either byte order.
ENCODINGS = {
    "utf-8": (".jsonl", lambda t: t.encode("utf-8")),
    "utf-8-bom": (".jsonl", lambda t: codecs.BOM_UTF8 + t.encode("utf-8")),
    "utf-16-bom": (".jsonl", lambda t: t.replace("\n", "\r\n").encode("utf-16")),
    "utf-16-be-bom": (".jsonl", lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be")),
    "utf-16-le": (".jsonl", lambda t: t.encode("utf-16-le")),
    "utf-16-be": (".jsonl", lambda t: t.encode("utf-16-be")),
    "utf-32-bom": (".jsonl", lambda t: t.encode("utf-32")),
    "utf-32-be": (".jsonl", lambda t: t.encode("utf-32-be")),
    "utf-16-bom-gz": (".jsonl.gz", lambda t: gzip.compress(t.encode("utf-16"))),
    "utf-8-bom-gz": (".jsonl.gz", lambda t: gzip.compress(codecs.BOM_UTF8 + t.encode("utf-8"))),
}


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def read_all(path: str) -> list[dict]:
    items = list(iter_source(DatasetSourceConfig(data_files=[path])))
    assert [item.error for item in items if item.error] == []
    return [item.record for item in items]


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_every_unicode_encoding_reads_as_the_same_records(tmp_path, name):
    suffix, save = ENCODINGS[name]
    want = rows()
    path = write(tmp_path / f"data{suffix}", save(jsonl_text(want)))
    assert read_all(path) == want
    head = head_records(path, 3)
    assert [item.record for item in head] == want[:3] and head[0].where == f"{path}:1"
    assert detect_schema(path).schema == "sharegpt"


@pytest.mark.parametrize("name", ["utf-8-bom", "utf-16-bom", "utf-16-le", "utf-32-be", "utf-16-bom-gz"])
def test_a_json_array_in_any_encoding_reads_as_the_same_records(tmp_path, name):
    suffix, save = ENCODINGS[name]
    want = rows()
    path = write(tmp_path / f"data{suffix.replace('jsonl', 'json')}", save(json.dumps(want, ensure_ascii=False,
                                                                                      indent=1)))
    assert read_all(path) == want
    assert [item.record for item in head_records(path, 2)] == want[:2]  # the incremental array reader
    assert detect_schema(path).schema == "sharegpt"


def test_a_large_utf16_file_reads_whole_across_read_chunks(tmp_path):
    """Chunk edges fall inside surrogate pairs and CRLFs somewhere in 3000 lines of emoji."""
    want = rows(3000)
    path = write(tmp_path / "big.jsonl", jsonl_text(want, "\r\n").encode("utf-16"))
    assert read_all(path) == want


def test_bad_lines_of_a_utf16_file_are_rejects_naming_their_own_line(tmp_path):
    """Line numbers count the file's own lines, and a code unit that is no character spoils only its line."""
    good = rows(4)
    lines = [json.dumps(r, ensure_ascii=False).encode("utf-16-le") + "\n".encode("utf-16-le") for r in good]
    lone_surrogate = b"\x00\xd8"  # a high surrogate followed by no low one
    lines.insert(1, '{"id": "torn", '.encode("utf-16-le") + "\n".encode("utf-16-le"))
    lines.insert(3, '{"id": "x'.encode("utf-16-le") + lone_surrogate + '"}\n'.encode("utf-16-le"))
    path = write(tmp_path / "bad.jsonl", b"".join(lines) + b"{")  # an odd last byte: a cut-off code unit
    items = list(iter_source(DatasetSourceConfig(data_files=[path])))
    assert [item.record for item in items if item.error is None] == good
    bad = [(item.where, item.reason) for item in items if item.error is not None]
    assert bad == [(f"{path}:2", "malformed_json"), (f"{path}:4", "malformed_json"), (f"{path}:7", "malformed_json")]
    assert items[3].error == f"{path}:4: not valid UTF-16-LE (a code unit that is no character)"
    assert detect_schema(path).schema == "sharegpt"


# ----------------------------------------------------------------------------- cut-short files
def big_rows(n: int = 2000) -> list[dict]:
    """Records that do not compress to nothing, so half the .gz holds about half of them."""
    rng = random.Random(0)
    return [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"Question {rng.random()}?"},
                                              {"from": "gpt", "value": f"Answer {rng.random()}."}]}
            for i in range(n)]


def truncated_gz(path: Path, data: bytes, keep: float = 0.5) -> str:
    packed = gzip.compress(data)
    return write(path, packed[: int(len(packed) * keep)])


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_a_truncated_gzip_stops_with_one_line_naming_the_last_line_read(tmp_path, encoding):
    path = truncated_gz(tmp_path / "cut.jsonl.gz", jsonl_text(big_rows()).encode(encoding))
    read = []
    with pytest.raises(UnreadableDataFile) as exc:
        for item in iter_source(DatasetSourceConfig(data_files=[path])):
            read.append(item)
    assert 8 < len(read) < 2000 and all(item.error is None for item in read)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg == (f"{path}: is truncated or corrupt after line {len(read)} (EOFError: Compressed file ended before "
                   "the end-of-stream marker was reached); the records after it cannot be read: restore the file "
                   "(copy or download it again) and rerun")
    # Telling the schema needs only the first records, which are there: prep reports the break.
    assert len(head_records(path, 8)) == 8 and detect_schema(path).schema == "sharegpt"


def test_a_gzip_corrupt_mid_stream_or_cut_before_its_first_record_is_one_line(tmp_path):
    packed = bytearray(gzip.compress(jsonl_text(big_rows()).encode()))
    packed[len(packed) // 2: len(packed) // 2 + 64] = bytes(64)  # zeros over the middle: garbage, then a bad CRC
    path = write(tmp_path / "crc.jsonl.gz", bytes(packed))
    with pytest.raises(UnreadableDataFile, match=r"crc\.jsonl\.gz: is truncated or corrupt after line \d+ "
                                                 r"\(gzip\.BadGzipFile: CRC check failed .*restore the file"):
        list(iter_source(DatasetSourceConfig(data_files=[path])))
    second = bytearray(gzip.compress(jsonl_text(big_rows(5)).encode()))
    second[10] = 0xFF  # the first deflate block of the second member: a reserved block type
    path = write(tmp_path / "corrupt.jsonl.gz", gzip.compress(jsonl_text(big_rows(20)).encode()) + bytes(second))
    with pytest.raises(UnreadableDataFile, match=r"corrupt\.jsonl\.gz: is truncated or corrupt after line 20 "
                                                 r"\(zlib\.error: Error -3 while decompressing data: invalid block "
                                                 r"type\); the records after it cannot be read"):
        list(iter_source(DatasetSourceConfig(data_files=[path])))
    short = truncated_gz(tmp_path / "short.jsonl.gz", jsonl_text(big_rows(3)).encode(), keep=0.3)
    with pytest.raises(UnreadableDataFile, match="short.jsonl.gz: is truncated or corrupt at its start"):
        list(iter_source(DatasetSourceConfig(data_files=[short])))
    with pytest.raises(SchemaError) as exc:
        detect_schema(short)
    assert str(exc.value).startswith(f"{short}: is truncated or corrupt at its start (EOFError: ")
    array = truncated_gz(tmp_path / "cut.json.gz", json.dumps(big_rows()).encode())
    with pytest.raises(UnreadableDataFile, match=r"cut\.json\.gz: is truncated or corrupt at its start"):
        list(iter_source(DatasetSourceConfig(data_files=[array])))
    assert len(head_records(array, 8)) == 8  # the incremental array reader reads only the first records


# ----------------------------------------------------------------------------- the entrypoint
def test_cli_prep_of_a_utf16_file_keeps_its_text(cli, tmp_path):
    want = rows()
    path = write(tmp_path / "notepad.jsonl", jsonl_text(want, "\r\n").encode("utf-16"))
    root = tmp_path / "artifacts"
    result = cli("stage=prep", "dataset=files", f"dataset.files=[{path}]", "dataset.track=target_native", root=root)
    assert result.returncode == 0, result.stderr
    [unit] = [Manifest.load(d) for d in (root / "prep").iterdir()]
    assert unit.status == "complete" and (unit.counts["in"], unit.counts["out"]) == (6, 6)
    got = {r["meta"]["raw_id"]: [m["content"] for m in r["messages"]]
           for r in read_jsonl(unit.dir / "conversations.jsonl")}
    assert got == {r["id"]: [turn["value"] for turn in r["conversations"]] for r in want}


def test_cli_prep_of_a_truncated_gzip_exits_3_with_one_line_and_no_complete_unit(cli, tmp_path):
    path = truncated_gz(tmp_path / "cut.jsonl.gz", jsonl_text(big_rows()).encode())
    root = tmp_path / "artifacts"
    result = cli("stage=prep", "dataset=files", f"dataset.files=[{path}]", "dataset.track=target_native", root=root)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith("eagle3:")]
    assert line.startswith(f"eagle3: {path}: is truncated or corrupt after line ") and "restore the file" in line
    [unit] = [Manifest.load(d) for d in (root / "prep").iterdir()]
    assert unit.status != "complete" and not (unit.dir / "conversations.jsonl").exists()
