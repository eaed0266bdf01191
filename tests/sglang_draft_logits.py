"""SGLang's own EAGLE-3 draft class on an eagle3 draft export: the logits of the first draft step.

Run with the SGLang CPU environment's python (`tests.sglang_env.sglang_python`, made by
`scripts/setup_sglang_cpu.sh`), never eagle3's; it imports nothing from eagle3:

    python tests/sglang_draft_logits.py --draft EXPORT --target TARGET --inputs IN.safetensors \
        --out OUT.safetensors

IN holds `input_ids` [T] (int64), `positions` [T] (int64) and `aux` [T, C*H_target] (float32: the
target's captured states, the capture blocks in the export's `eagle_config` order), and may hold
more aux sets for the same tokens, `aux<suffix>`. OUT gets, per aux set, `logits<suffix>`
[T, draft_vocab] (float32) of one forward of the first draft step over the T tokens of one request
with no cached prefix, and `carry<suffix>` [T, H] (float32): the state that forward hands the next
draft step (the model's one aux hidden state, which the logits processor stores as the next step's
`spec_info.hidden_states`: pre-norm, or final-normed with `norm_output`); for an MLA draft also
`logits_draft_extend_v2<suffix>`: the same forward in the mode of the spec-v2 draft extend, for
which SGLang runs the absorbed (latent) attention that decoding uses instead of the prefill's MHA.
Besides: `hot_token_id` [draft_vocab] (draft id -> target id, from the export's `d2t` as SGLang
reads it), and metadata: `class` (module.Name SGLang built), `unset` (JSON list of parameters the
checkpoint did not set) and `forward_methods` (JSON, MLA drafts: the attention method SGLang chose
for each forward mode).

What is SGLang's: the model class, resolved from the export's `architectures` by SGLang's model
registry (`ModelConfig` + `get_model`, as a server's ModelRunner builds its draft); the weights,
read from `model.safetensors` by SGLang's loader and its class's own `load_weights` (fusing q/k/v,
gate/up, MLA's A-projections, `post_load_weights`); the embedding sharing (`set_embed`, as the
EAGLE worker does); every layer's math (fc, norms, projections, rope, MLA's latent split, MLP)
and the lm_head matmul (`LogitsProcessor._compute_lm_head`).

Stand-ins, each for what SGLang gets from a GPU server and this CPU run has not:
- Process groups and the runtime context (world of 1, gloo; `publish(ServerArgs(...))`): a server's
  scheduler process sets these up before it builds a model; layers read TP rank/size and the
  server arguments from them.
- `RadixAttention.forward` -> causal scaled-dot-product attention over the request's T tokens with
  the layer's own head counts and scaling: the real one hands q/k/v to the attention backend,
  which writes and reads the paged KV pool a ModelRunner allocates (torch_native cannot run
  EAGLE-3 on CPU: docs/design.md, 'Facts: SGLang'). q/k/v and everything around the softmax are
  SGLang's.
- The ForwardBatch: a namespace with the fields these forwards read (`spec_info.hidden_states`: the
  aux states the target worker would hand over; the forward mode; no multimodal input; one request
  with no cached prefix). A real one is built by the scheduler from a batch with KV pool slots.
- MLA only: a forward context whose attention backend is named "triton" (one SGLang serves MLA
  with on GPUs; the forward context holds the ModelRunner's backend object), so that SGLang's own
  dispatch chooses the attention method: MHA for a prefill with no cached prefix, the absorbed MLA
  for the spec-v2 draft extend. `_set_mla_kv_buffer` does nothing (it stores the latent in the KV
  pool). SGLang's CPU rope for MLA accepts deepseek yarn only, so the rope is yarn with factor 1,
  which is the default rope, given as SGLang's `model_override_args` (the server's
  `--json-model-override-args`).
- `torch.cuda.synchronize` does nothing while `set_embed` runs (the MLA class's synchronises CUDA
  unconditionally; there is no CUDA here).

Checks, not stand-ins: every parameter is NaN before `load_weights` runs (`unset` lists those still
NaN after: `load_weights` skips names it does not know without a word, and an embedding `set_embed`
declined to share would stay NaN too), and MLA's dispatch is wrapped to record its choice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import types
import warnings

os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

LLAMA = "LlamaForCausalLMEagle3"
MLA = "Eagle3DeepseekV2ForCausalLM"
EMBED_KEY = "model.embed_tokens.weight"


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _init_runtime(draft_dir: str) -> None:
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    os.environ.setdefault("MASTER_PORT", _free_port())
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path=draft_dir, device="cpu", dtype="float32", attention_backend="torch_native",
                       sampling_backend="pytorch", disable_cuda_graph=True),
            role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    initialize_model_parallel(backend="gloo")


def _causal_attention(self, q, k, v, forward_batch, save_kv_cache=True, **kwargs):
    """RadixAttention's contract (q [T, Hq*Dqk], k [T, Hk*Dqk], v [T, Hv*Dv] -> [T, Hq*Dv]) for the
    T tokens of one request with no cached prefix: causal, the layer's `scaling`."""
    if kwargs.get("q_rope") is not None or kwargs.get("k_rope") is not None:
        raise NotImplementedError("RadixAttention stand-in: separate rope inputs (a fused MLA backend)")
    tokens = q.shape[0]
    q = q.reshape(tokens, self.tp_q_head_num, -1).transpose(0, 1)
    k = k.reshape(tokens, self.tp_k_head_num, -1).transpose(0, 1)
    v = v.reshape(tokens, self.tp_v_head_num, -1).transpose(0, 1)
    if k.shape[0] != q.shape[0]:  # grouped / multi-query heads
        k = k.repeat_interleave(q.shape[0] // k.shape[0], 0)
        v = v.repeat_interleave(q.shape[0] // v.shape[0], 0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
    return out.transpose(0, 1).reshape(tokens, -1)


def _build(draft_dir: str, architecture: str):
    """SGLang's draft model for the export, as its ModelRunner builds it; (model, unset params)."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model
    from sglang.srt.models.registry import ModelRegistry

    override = {}
    if architecture == MLA:
        with open(os.path.join(draft_dir, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
        if (cfg.get("rope_parameters") or {}).get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
            raise SystemExit(f"{draft_dir}: rope other than the default; the yarn stand-in covers the default only")
        override = {"rope_parameters": {"rope_type": "yarn", "rope_theta": theta, "factor": 1.0,
                                        "original_max_position_embeddings": cfg["max_position_embeddings"],
                                        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
    model_config = ModelConfig(draft_dir, is_draft_model=True, dtype="float32", speculative_algorithm="EAGLE3",
                               model_override_args=json.dumps(override))
    cls, _ = ModelRegistry.resolve_model_cls(model_config.hf_config.architectures)
    # Instrument, not stand-in: every parameter starts as NaN, so one the checkpoint leaves unset
    # shows up (load_weights skips names it does not know without a word).
    own_load = cls.load_weights

    def load_weights(model, weights):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        return own_load(model, weights)

    cls.load_weights = load_weights
    try:
        model = get_model(model_config=model_config, load_config=LoadConfig(), device_config=DeviceConfig("cpu"))
    finally:
        cls.load_weights = own_load
    unset = sorted(n for n, p in model.named_parameters() if n != EMBED_KEY and bool(p.isnan().any()))
    return model.eval(), unset


def _share_embedding(model, target_dir: str) -> None:
    """The target's input embedding, handed over as SGLang's EAGLE worker does (`set_embed`)."""
    with safe_open(os.path.join(target_dir, "model.safetensors"), framework="pt") as fh:
        embed = fh.get_tensor(EMBED_KEY).float()
    sync = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *a, **k: None
    try:
        model.set_embed(torch.nn.Parameter(embed, requires_grad=False))
    finally:
        torch.cuda.synchronize = sync


def _forward_batch(aux: torch.Tensor, mode):
    return types.SimpleNamespace(spec_info=types.SimpleNamespace(hidden_states=aux), forward_mode=mode,
                                 mm_input_embeds=None, contains_mm_inputs=lambda: False, out_cache_loc=None,
                                 extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[aux.shape[0]],
                                 mha_one_shot=False, mha_return_lse=False, attn_cp_metadata=None)


def _mla_hooks(model, methods: dict):
    """MLA: SGLang's own choice of attention method under the stand-in backend (recorded per forward
    mode), no KV pool writes; the forward context to run in."""
    from sglang.srt.model_executor.forward_context import ForwardContext

    attn = model.model.midlayer.self_attn
    own_dispatch = attn.dispatch_attn_forward_method

    def dispatch(forward_batch):
        method = own_dispatch(forward_batch)
        methods[forward_batch.forward_mode.name] = method.name
        return method

    attn.dispatch_attn_forward_method = dispatch
    attn._set_mla_kv_buffer = lambda *a, **k: None
    backend = types.SimpleNamespace(prefill_attention_backend_str="triton", decode_attention_backend_str="triton")
    return ForwardContext(attn_backend=backend)


def _logits(model, inputs: dict, aux: torch.Tensor, mode, context) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's logits and the state it hands the next draft step (its one aux hidden state,
    which the logits processor stores as `hidden_states`, the next step's `spec_info.hidden_states`)."""
    from sglang.srt.model_executor.forward_context import forward_context

    with torch.no_grad(), (forward_context(context) if context is not None else contextlib.nullcontext()):
        to_logits, [carry] = model.model(inputs["input_ids"], inputs["positions"], _forward_batch(aux, mode))
        return model.logits_processor._compute_lm_head(to_logits, model.lm_head).float(), carry.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", required=True, help="the eagle3 draft export (config.json + model.safetensors)")
    parser.add_argument("--target", required=True, help="the target model directory (its embedding is shared)")
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    with open(os.path.join(args.draft, "config.json"), encoding="utf-8") as fh:
        [architecture] = json.load(fh)["architectures"]
    if architecture not in (LLAMA, MLA):
        raise SystemExit(f"{args.draft}: architectures: found {architecture!r}, expected {LLAMA!r} or {MLA!r}")
    torch.set_default_dtype(torch.float32)
    _init_runtime(args.draft)
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    RadixAttention.forward = _causal_attention
    model, unset = _build(args.draft, architecture)
    _share_embedding(model, args.target)
    inputs = load_file(args.inputs)
    methods: dict = {}
    context = _mla_hooks(model, methods) if architecture == MLA else None
    out = {"hot_token_id": model.get_hot_token_id().to(torch.int64)}
    for key in sorted(k for k in inputs if k.startswith("aux")):
        suffix = key.removeprefix("aux")
        out[f"logits{suffix}"], out[f"carry{suffix}"] = _logits(model, inputs, inputs[key], ForwardMode.EXTEND,
                                                                context)
        if architecture == MLA:
            out[f"logits_draft_extend_v2{suffix}"], _ = _logits(model, inputs, inputs[key],
                                                               ForwardMode.DRAFT_EXTEND_V2, context)
    cls = type(model)
    save_file({k: v.contiguous() for k, v in out.items()}, args.out,
              metadata={"class": f"{cls.__module__}.{cls.__name__}", "unset": json.dumps(unset),
                        "forward_methods": json.dumps(methods)})
    print(f"{cls.__module__}.{cls.__name__}: logits {tuple(out['logits'].shape)}, unset {unset}, methods {methods}")


if __name__ == "__main__":
    main()
