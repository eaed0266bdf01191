"""The choices of draft training a config makes (`train.*`, `model.draft.*`), torch-free for config validation."""

from __future__ import annotations

# The lists of valid values live in the schema's `eagle3.config.choices` (its fields check them); the
# names this package acts on are spelled here, with what each does.
from eagle3.config.choices import (  # noqa: F401  (re-exported with the names they list)
    ATTENTIONS,
    HIDDEN_STATE_MODES,
    LOSSES,
    LR_SCHEDULES,
    OUT_OF_VOCAB_POLICIES,
    PRECISIONS,
    STEP_WEIGHTS,
    STRATEGIES,
    TEACHERS,
    TTT_CHAINS,
)

# Re-exported: the draft's layer variants are engine facts, kept below config (see below).
from eagle3.engines import LAYER_VARIANTS, SERVING_LAYER, VARIANT_ENGINES, serving_layer_default  # noqa: F401

#: `train.out_of_vocab`: positions whose target argmax is outside the draft vocab are left out
#: of the loss (mask) or trained toward the renormalised in-vocab distribution (keep); they
#: always count as misses in the metrics.
OOV_MASK, OOV_KEEP = "mask", "keep"
#: `train.teacher`: the target's distribution renormalised over the draft vocab (KL between two
#: draft-vocab distributions), or its full-vocab probabilities restricted to the draft vocab
#: without renormalising (the KL over the full vocab with the draft's out-of-vocab mass at 0:
#: positions whose mass lies mostly outside the draft vocab weigh less).
TEACHER_DRAFT_VOCAB, TEACHER_FULL_VOCAB = "draft_vocab", "full_vocab"
#: `train.loss`, the distance each TTT step's draft distribution q is trained to close to the
#: teacher's p, with alpha = sum min(p, q) (the acceptance rate of a sampled draft token):
#: kl = KL(p || q) (EAGLE-3's; the fused default); tv = total variation 1/2 sum |p - q| (= 1 - alpha);
#: jsd = Jensen-Shannon, 1/2 KL(p || m) + 1/2 KL(q || m) with m = (p + q) / 2; nla = -log alpha
#: (TV's optimum with a 1/alpha gradient boost, so it trains from a cold start); lk = the LK loss
#: (arXiv 2602.23881), lambda KL + (1 - lambda) TV with lambda = exp(-LK_ETA x mean alpha of the
#: step's rows), detached: KL while the draft is poor, acceptance itself once it is good.
LOSS_KL, LOSS_TV, LOSS_JSD, LOSS_NLA, LOSS_LK = "kl", "tv", "jsd", "nla", "lk"
#: The LK blend's decay rate (the paper's eta; 0 would be pure KL).
LK_ETA = 3.0
#: `train.step_weights`, how the TTT steps' losses are weighted: decay = `train.ttt_decay`^k, fixed;
#: dpace = D-PACE (arXiv 2605.18810): each prediction weighted by d E[accepted length] / d log a_k =
#: sum_{m >= k} prod_{j <= m} a_j over its own draft chain (a_j = that step's alpha, detached), so the
#: positions that currently limit acceptance get the signal; `train.ttt_decay` is then unused.
STEP_WEIGHTS_DECAY, STEP_WEIGHTS_DPACE = "decay", "dpace"
#: `train.ttt_chains`, which chains a TTT step after the first trains: all = every chain, reading the
#: data's token whatever the draft drafted before (EAGLE-3's TTT); on_policy = only the chains whose
#: drafted tokens so far were the data's, the states a served draft reaches reading its own tokens
#: (eagle3.draft.chains.UnbrokenChains); rescored = every chain whose first step is in the answer reads
#: the draft's own tokens and learns toward the target's score of them (eagle3.draft.rescoring: the
#: target runs in the training process, one forward over the sample and its chains per batch).
TTT_CHAINS_ALL, TTT_CHAINS_ON_POLICY, TTT_CHAINS_RESCORED = "all", "on_policy", "rescored"
#: `train.lr_schedule`: after the linear warmup, cosine or linear down to `train.min_lr_ratio` x lr.
#: `train.hidden_states`: read from the store stage extract filled, computed per batch while training,
#: or hybrid: computed the first time a sample is fetched, stored, and read afterwards.
STORE, ONLINE, HYBRID = "store", "online", "hybrid"
#: The modes whose training computes states from the target (the merged split is their input).
COMPUTING_MODES = (ONLINE, HYBRID)
# `train.strategy`: the Lightning strategies this trainer is tested with.
#: `train.precision`: auto = bf16-mixed on a GPU, 32-true on CPU; else a Lightning precision.
AUTO_PRECISION = "auto"

#: `model.draft.attention`: the draft layer's attention. llama = grouped-query attention with q/k/v
#: projections (EAGLE-3's layer: vLLM's llama_eagle3, SGLang's LlamaForCausalLMEagle3); mla = DeepSeek's
#: multi-head latent attention at the target's MLA geometry (vLLM's and SGLang's
#: Eagle3DeepseekV2ForCausalLM, the public Kimi-K2.5 MLA drafts). MLA needs a target with MLA
#: geometry (`eagle3.draft.geometry.MLA_FIELDS`) or those fields set under `model.draft`.
ATTENTION_LLAMA, ATTENTION_MLA = "llama", "mla"
#: The MLA draft's export: vLLM's `deepseek_eagle3.py` and SGLang's `kimi_k25_eagle3.py` both register
#: this name. Its model_type must be deepseek_v2: vLLM rewrites a deepseek_v3 draft config to its MTP
#: model and refuses it ('Eagle3DeepSeekMTPModel ... not supported').
MLA_ARCHITECTURE, MLA_MODEL_TYPE = "Eagle3DeepseekV2ForCausalLM", "deepseek_v2"

# `model.draft` layer variants (LAYER_VARIANTS: what each changes), the engines that serve each
# (VARIANT_ENGINES) and a draft's default layer by the engine that will serve it (SERVING_LAYER,
# `serving_layer_default`) live in the leaf `eagle3.engines`: config's resolvers read them.


def variant_engines_refusing(variants: dict, engines) -> dict[str, list[str]]:
    """`{engine: [variants it cannot serve]}` for the variants set true in `variants`."""
    refused: dict[str, list[str]] = {}
    for name in LAYER_VARIANTS:
        if variants.get(name):
            for engine in engines:
                if engine not in VARIANT_ENGINES[name]:
                    refused.setdefault(engine, []).append(name)
    return refused
