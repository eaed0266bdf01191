"""SGLang's own EAGLE-3 draft classes load our SGLang exports and compute what eagle3's draft does.

SGLang cannot serve a draft on this CPU (docs/design.md, 'Facts: SGLang'), so this stands in for
speculative serving: `tests/sglang_draft_logits.py`, run in the SGLang CPU environment
(`tests.sglang_env`), builds the class the export's `architectures` names through SGLang's model
registry and loader, loads the export with the class's own `load_weights`, shares the target's
embedding as SGLang's EAGLE worker does, and runs the first draft step over real token ids and
seeded random aux states. eagle3's side is the same step as the in-process eval runs it
(`Eagle3Drafter.extend`: `project`, `step` with a KV cache per layer, `logits`) on the export as
`load_exported` reads it back. Both in float32: max abs diff <= 1e-4 and the same argmax at every
position, and the state the step hands the next one (`Eagle3Draft.carry`; SGLang's aux hidden
state) within the same tolerance. The same aux states with their capture blocks in another order
must move SGLang's logits far past that tolerance, so the comparison can fail.

(a) The shared demo chain's draft trained with the layer SGLang serves by default (fc_norm, no
norm_before_residual), its `draft/sglang` export (`LlamaForCausalLMEagle3`): the chain's default
draft is vLLM's norm_before_residual layer, exported for vLLM alone.
(b) An MLA draft for the Kimi-shaped demo target (`Eagle3DeepseekV2ForCausalLM`): randomly
initialised (norms too) and exported with `export_draft`, no training chain. SGLang runs it twice:
MHA (its prefill path) and the absorbed latent attention (its spec-v2 draft extend and decode path).
(c) Each layer variant SGLang serves (`eagle3.engines.VARIANT_ENGINES`: norm_before_fc, fc_norm,
norm_output; the MLA draft has no norm_before_fc), alone, in a random draft for the demo target
(llama) and the Kimi-shaped one (MLA) exported for SGLang: SGLang reads the variant's config key and
its tensors (`input_norm.weight`, `fc_norm.<i>.weight`), and the same weights with the variant off
(the plain layer) are far from SGLang's logits or carried state, so the variant is not ignored.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3.draft.attention import DraftKVCache
from eagle3.draft.export import export_draft, load_exported
from eagle3.draft.geometry import geometry_from_target
from eagle3.draft.model import Eagle3Draft
from eagle3.draft.speculative import Eagle3Drafter
from eagle3.engines import LAYER_VARIANTS, SGLANG, VARIANT_ENGINES
from eagle3.paths import PROJECT_ROOT, asset_path
from tests.conftest import HANG_GUARD_S, run_cli, unit_dirs
from tests.sglang_env import sglang_python as _sglang_python

pytestmark = pytest.mark.slow

SCRIPT = PROJECT_ROOT / "tests" / "sglang_draft_logits.py"
TOLERANCE = 1e-4  # float32 on both sides; measured ~1e-6
#: Real text in the targets' own tokenizers: the draft sees token ids a request would carry.
TEXT = ("The draft model proposes a few tokens; the target verifies them in one forward pass and "
        "keeps the longest prefix it agrees with.")
EMBED_KEY = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def sglang_python():
    return _sglang_python()


def _token_ids(target: Path) -> torch.Tensor:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target), trust_remote_code=target.name == "demo_kimi_target")
    ids = torch.tensor(tokenizer(TEXT, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    assert 16 <= len(ids) <= 64, len(ids)
    return ids


def _target_embedding(target: Path) -> torch.Tensor:
    with safe_open(str(target / "model.safetensors"), framework="pt") as fh:
        return fh.get_tensor(EMBED_KEY).float()


def _inputs(export: Path, target: Path, seed: int) -> dict[str, torch.Tensor]:
    """Token ids, positions, seeded aux states; `aux_permuted`: the same states, capture blocks rotated."""
    geometry, _, _ = load_exported(export)
    ids = _token_ids(target)
    captures = len(geometry.capture_layers)
    generator = torch.Generator().manual_seed(seed)
    aux = torch.randn(len(ids), geometry.fc_in_features, generator=generator)
    blocks = aux.chunk(captures, dim=-1)
    permuted = torch.cat([*blocks[1:], blocks[0]], dim=-1)
    return {"input_ids": ids, "positions": torch.arange(len(ids)), "aux": aux, "aux_permuted": permuted}


def _first_step(draft: Eagle3Draft, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's first-step logits `[T, draft_vocab]` and the state it carries to the next step
    `[T, H]`: the calls of `Eagle3Drafter.extend` (the in-process eval's draft prefill), every position kept."""
    with torch.no_grad():
        hidden = draft.project(inputs["aux"].unsqueeze(0))
        caches = [DraftKVCache() for _ in range(draft.geometry.num_layers)]
        state = draft.step(hidden, inputs["input_ids"].unsqueeze(0), inputs["positions"],
                           [cache.attend for cache in caches])
        return draft.logits(state)[0], draft.carry(state)[0]


def _eagle3(export: Path, target: Path,
            inputs: dict[str, torch.Tensor]) -> tuple[Eagle3Draft, torch.Tensor, torch.Tensor]:
    """eagle3's draft as read back from the export, its first-step logits and carried state."""
    _, engine, draft = load_exported(export)
    assert engine == "sglang"
    draft.eval()
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(_target_embedding(target))
    return draft, *_first_step(draft, inputs)


def _sglang(python: str, export: Path, target: Path, inputs: dict[str, torch.Tensor],
            work: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    work.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(work / "inputs.safetensors"))
    out = work / "logits.safetensors"
    done = subprocess.run([python, str(SCRIPT), "--draft", str(export), "--target", str(target),
                           "--inputs", str(work / "inputs.safetensors"), "--out", str(out)],
                          cwd=work, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    with safe_open(str(out), framework="pt") as fh:
        metadata = fh.metadata()
    return load_file(str(out)), metadata


def _compare(python: str, export: Path, target: Path, work: Path,
             seed: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The checks both exports share; SGLang's outputs and metadata for the caller's own."""
    config = json.loads((export / "config.json").read_text())
    inputs = _inputs(export, target, seed)
    draft, ours, carry = _eagle3(export, target, inputs)
    theirs, metadata = _sglang(python, export, target, inputs, work)

    # SGLang built the class the export names and the checkpoint set every parameter of it.
    assert metadata["class"].rsplit(".", 1)[1] == config["architectures"][0], metadata["class"]
    assert json.loads(metadata["unset"]) == [], metadata["unset"]
    assert torch.equal(theirs["hot_token_id"], draft.draft_ids())  # d2t read as ours

    logits = theirs["logits"]
    assert logits.shape == ours.shape == (len(inputs["input_ids"]), draft.geometry.draft_vocab_size)
    diff = float((logits - ours).abs().max())
    print(f"{export}: {metadata['class']} max abs logits diff {diff:.3g} (scale {float(ours.abs().max()):.3g})")
    assert diff <= TOLERANCE
    assert torch.equal(logits.argmax(-1), ours.argmax(-1))
    # What the next draft step reads (pre-norm, or final-normed with norm_output) is ours too.
    assert theirs["carry"].shape == carry.shape
    assert float((theirs["carry"] - carry).abs().max()) <= TOLERANCE

    # The in-process eval's first drafted token is SGLang's argmax at the last position, in target ids.
    drafter = Eagle3Drafter(draft)
    drafter.extend(inputs["aux"], inputs["input_ids"].tolist(), 0)
    assert drafter.propose(1) == [int(theirs["hot_token_id"][logits[-1].argmax()])]

    # The comparison can fail: the capture blocks in another order give other logits, by far.
    moved = float((theirs["logits_permuted"] - logits).abs().max())
    assert moved > 100 * TOLERANCE, moved
    assert float((theirs["logits_permuted"] - ours).abs().max()) > 100 * TOLERANCE
    return theirs, metadata


def test_sglang_llama_draft_class_gives_the_demo_chain_exports_logits(sglang_python, demo_chain, tmp_path):
    # The chain's default draft has vLLM's norm_before_residual layer (it follows server.backend:
    # eagle3.engines.SERVING_LAYER), which SGLang does not serve, so it has no SGLang export. SGLang's
    # default layer (fc_norm alone) trained on the same chain (its data and schedule; only the train
    # unit is new) has.
    root = demo_chain.root
    before = unit_dirs(root, "train")
    done = run_cli(["stage=train", *demo_chain.overrides, "model.draft.norm_before_residual=false",
                    f"paths.root={root}"], cwd=root.parent / "elsewhere")
    assert done.returncode == 0, done.stderr[-3000:]
    [unit] = unit_dirs(root, "train") - before
    export = unit / "draft" / "sglang"
    assert json.loads((export / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    _compare(sglang_python, export, asset_path("demo_target"), tmp_path / "sglang", seed=0)


def _random_export(target: Path, options: dict, out: Path) -> Path:
    """A random draft for `target` (capture [2, 4, 5], draft vocab 2048, `options` as
    `model.draft`), exported for SGLang in float32. Norm weights away from 1 (`fc_norm.<i>` too), so
    a norm loaded into the wrong place, or not applied, shows."""
    target_config = json.loads((target / "config.json").read_text())
    geometry = geometry_from_target(target_config, [2, 4, 5], 2048, options)
    torch.manual_seed(0)
    draft = Eagle3Draft(geometry)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight") or name.startswith("fc_norm."):
                p.copy_(1 + 0.2 * torch.randn_like(p))
        weights = load_file(str(target / "model.safetensors"))
        ids = torch.sort(torch.randperm(geometry.vocab_size)[: geometry.draft_vocab_size]).values
        t2d = torch.zeros(geometry.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        head = weights.get("lm_head.weight", weights[EMBED_KEY])  # demo_target ties its embeddings
        draft.init_from_target(weights[EMBED_KEY].float(), head.float(),
                               ids - torch.arange(geometry.draft_vocab_size), t2d)
    return export_draft(draft, out, "sglang", dtype="float32")


def _mla_export(out: Path) -> Path:
    """A random MLA draft for the Kimi-shaped demo target, the plain layer (conf/model/demo_kimi.yaml)."""
    return _random_export(asset_path("demo_kimi_target"), {"attention": "mla"}, out)


def test_sglang_mla_draft_class_gives_a_kimi_mla_exports_logits(sglang_python, tmp_path):
    export = _mla_export(tmp_path / "draft" / "sglang")
    assert json.loads((export / "config.json").read_text())["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    theirs, metadata = _compare(sglang_python, export, asset_path("demo_kimi_target"), tmp_path / "sglang", seed=1)
    assert json.loads(metadata["forward_methods"]) == {"EXTEND": "MHA", "DRAFT_EXTEND_V2": "MLA"}
    # SGLang's absorbed latent attention (w_kc/w_vc split from kv_b_proj on load), which its spec-v2
    # draft extend and decode steps run, agrees with its MHA prefill path, hence with ours.
    absorbed = theirs["logits_draft_extend_v2"]
    diff = float((absorbed - theirs["logits"]).abs().max())
    print(f"MLA absorbed vs MHA: max abs logits diff {diff:.3g}")
    assert diff <= TOLERANCE
    assert torch.equal(absorbed.argmax(-1), theirs["logits"].argmax(-1))
    assert float((theirs["logits_draft_extend_v2_permuted"] - absorbed).abs().max()) > 100 * TOLERANCE


#: The variants SGLang serves, per draft attention (the MLA draft has no norm_before_fc: refused).
SGLANG_VARIANTS = [(attention, variant) for attention in ("llama", "mla") for variant in LAYER_VARIANTS
                   if SGLANG in VARIANT_ENGINES[variant] and not (attention == "mla" and variant == "norm_before_fc")]
VARIANT_TARGETS = {"llama": ("demo_target", {"fc_in_features": 768}),  # tests/unit/serving/test_commands.py drafts
                   "mla": ("demo_kimi_target", {"attention": "mla"})}
VARIANT_TENSORS = {"norm_before_fc": ["input_norm.weight"], "fc_norm": [f"fc_norm.{i}.weight" for i in range(3)],
                   "norm_output": []}


def test_sglang_serves_norm_before_fc_fc_norm_and_norm_output_and_nothing_else():
    assert [v for v in LAYER_VARIANTS if SGLANG in VARIANT_ENGINES[v]] == ["norm_before_fc", "fc_norm", "norm_output"]


@pytest.mark.parametrize("attention,variant", SGLANG_VARIANTS, ids=[f"{a}-{v}" for a, v in SGLANG_VARIANTS])
def test_sglang_draft_class_runs_each_layer_variant_it_serves_as_eagle3_does(sglang_python, tmp_path, attention,
                                                                              variant):
    name, options = VARIANT_TARGETS[attention]
    target = asset_path(name)
    export = _random_export(target, {**options, variant: True}, tmp_path / "draft" / "sglang")
    config = json.loads((export / "config.json").read_text())
    assert config[variant] is True and all(config[v] is False for v in LAYER_VARIANTS if v != variant)
    with safe_open(str(export / "model.safetensors"), framework="pt") as fh:
        extra = sorted(k for k in fh.keys() if k.startswith(("input_norm.", "fc_norm.")))
    assert extra == VARIANT_TENSORS[variant]  # SGLang set them: `_compare` finds no parameter unset
    theirs, _ = _compare(sglang_python, export, target, tmp_path / "sglang", seed=2)

    # The plain layer with the same weights is far from SGLang's: the variant changed what it computed.
    inputs = _inputs(export, target, seed=2)
    _, _, draft = load_exported(export)
    plain = Eagle3Draft(dataclasses.replace(draft.geometry, **{variant: False})).eval()
    plain.load_state_dict({k: v for k, v in draft.state_dict().items()
                           if not k.startswith(("input_norm.", "fc_norm."))})
    with torch.no_grad():
        plain.embed_tokens.weight.copy_(_target_embedding(target))
    logits, carry = _first_step(plain, inputs)
    moved = max(float((theirs["logits"] - logits).abs().max()), float((theirs["carry"] - carry).abs().max()))
    print(f"{attention} {variant}: SGLang vs the plain layer {moved:.3g}")
    assert moved > 100 * TOLERANCE, moved
