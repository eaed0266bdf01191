"""In-process greedy speculative decoding: an HF target verifies chains drafted by EAGLE-3.

This is the real-decoding half of the eval stage (the simulated half is `acceptance.simulated_accept_length`).
It runs on CPU with the demo target and is the strongest correctness check the draft path has
(docs/design.md, 'Greedy speculative decoding is lossless'): with greedy verification the output
equals the target's own greedy output token for token, whatever the draft proposes.

Sequence bookkeeping (one prompt, batch 1). `seq` holds the committed tokens (prompt + output),
`L = len(seq)`. Between rounds:

* the target's KV cache holds positions `0 .. L-2`: the last committed token (the prefill's first
  new token, or a verify's bonus token) has not been fed to the target yet;
* the draft's cache holds the step-0 keys of the same positions `0 .. L-2`: position `t` read
  `fc(aux[t])` (the target's captured states at t) and the embedding of token `t+1`, exactly the
  TTT step-0 input (ttt.py). Its last output state predicts token `L` (draft token d1).

A round drafts `d1..dK` (chain, top-1): d1 from the stored last state; step `k = 1..K-1` feeds the
previous output state and token `d_k` at rope position `L-2+k` and attends to the cached prefix
plus the earlier steps of this round (TTT step k at position `t = L-2`). The target then runs ONE
forward over `[seq[L-1], d1 .. dK]` (positions `L-1 .. L-1+K`); its argmax at offset j is its
greedy choice for token `L+j`. The longest prefix `d1..da` that matches is accepted and the
target's argmax at offset `a` is appended as the bonus token, so a round commits `a+1` tokens.
Both caches are then cropped to the committed prefix: the target's to `L+a` (the rejected drafts'
keys go), the draft's to `L-1` (every drafted key goes), and the draft is re-run over the newly
committed positions `L-1 .. L-1+a` with the target's captured states of the verify forward and
the committed tokens `d1 .. da, bonus` — what serving engines do ("draft extend" after verify).

Accept length. The prefill's first token is not produced by a verify forward, so it is counted
in neither numerator nor denominator:

    accept_length = (output tokens committed by verify forwards) / (verify forwards)
                  = (len(output) - 1) / verify_forwards

after EOS / max_new_tokens truncation. SGLang's logged figure is `completion_tokens /
spec_verify_ct`, which includes the prefill token: `sglang_accept_length = len(output) /
verify_forwards`, reported alongside (it is higher by `1 / verify_forwards`). Draft quality,
before truncation, is in `accepted_per_verify` (drafts accepted per round, 0..K) and the
per-position counts: `reached[i]` rounds in which d1..d_{i-1} were all accepted (so d_i was
judged on a correct prefix), `accepted[i]` rounds in which d_i was accepted. `accepted[i] /
reached[i]` is the conditional rate comparable to TTT's `acc_k`; `accepted[i] / verify_forwards`
is the marginal rate, and `1 + sum_i marginal_i` is the untruncated accept length.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from eagle3.artifacts.console import Progress, progress
from eagle3.draft.attention import DraftKVCache
from eagle3.draft.model import Eagle3Draft

__all__ = [
    "ACCEPT_LENGTH_DEFINITION",
    "Drafter",
    "Eagle3Drafter",
    "GenerationResult",
    "SpecResult",
    "evaluate_speculative",
    "greedy_generate",
    "speculative_generate",
]


@dataclass
class GenerationResult:
    """Plain greedy decoding of one prompt.

    Attributes:
        tokens: Generated ids (the EOS token included when generation stopped on it).
        wall_s: Wall time of the whole generation, prefill included.
        forwards: Target forwards (prefill included).
    """

    tokens: list[int]
    wall_s: float
    forwards: int


@dataclass
class SpecResult:
    """Speculative decoding of one prompt; see the module docstring for the accounting.

    Attributes:
        tokens: Generated ids, truncated at EOS / max_new_tokens like `greedy_generate`.
        num_draft_tokens: K.
        verify_forwards: Target forwards over drafted chains (the prefill is not one).
        accepted_per_verify: Drafts accepted per verify, before truncation (0..K each).
        emitted_per_verify: Tokens each verify contributed to `tokens` after truncation.
        reached / accepted: `[K]` per-position counts (index i is draft position i+1).
        wall_s / draft_s / target_s: Wall time; time inside draft calls; inside target forwards.
    """

    tokens: list[int]
    num_draft_tokens: int
    verify_forwards: int = 0
    accepted_per_verify: list[int] = field(default_factory=list)
    emitted_per_verify: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0

    @property
    def verify_tokens(self) -> int:
        """Output tokens committed by verify forwards (everything but the prefill's token)."""
        return sum(self.emitted_per_verify)

    @property
    def accept_length(self) -> float:
        """Tokens per verify forward, prefill token excluded (1.0 when no verify ran)."""
        return self.verify_tokens / self.verify_forwards if self.verify_forwards else 1.0

    @property
    def sglang_accept_length(self) -> float:
        """SGLang's `completion_tokens / spec_verify_ct` (prefill token included)."""
        return len(self.tokens) / self.verify_forwards if self.verify_forwards else float(len(self.tokens))


class Drafter(Protocol):
    """What `speculative_generate` needs from a draft.

    `extend(aux, next_tokens, start)` is called with the target's captured states `[m, C*H_t]` of
    the committed positions `start .. start+m-1` and the committed token following each position
    (`seq[start+1 .. start+m]`); it must leave the drafter ready to propose the token after them.
    `propose(k)` returns k target ids; it may use scratch state but must not keep it.
    """

    def reset(self) -> None: ...

    def extend(self, aux: torch.Tensor, next_tokens: Sequence[int], start: int) -> None: ...

    def propose(self, k: int) -> list[int]: ...


class Eagle3Drafter:
    """Chain (top-1) drafting with an `Eagle3Draft` and a `DraftKVCache` per draft layer."""

    def __init__(self, draft: Eagle3Draft) -> None:
        self.draft = draft
        self.caches = self._new_caches()
        self.last_state: torch.Tensor | None = None  # [1, 1, H]: step-0 output at the last position
        self.length = 0  # committed positions in the cache

    def reset(self) -> None:
        self.caches = self._new_caches()
        self.last_state = None
        self.length = 0

    def _new_caches(self) -> list[DraftKVCache]:
        return [DraftKVCache() for _ in range(self.draft.geometry.num_layers)]

    def _attends(self):
        return [cache.attend for cache in self.caches]

    def _crop(self, length: int) -> None:
        for cache in self.caches:
            cache.crop(length)

    def _device(self) -> torch.device:
        return self.draft.fc.weight.device

    @torch.no_grad()
    def extend(self, aux: torch.Tensor, next_tokens: Sequence[int], start: int) -> None:
        if start != self.length:
            raise RuntimeError(f"draft cache holds {self.length} positions, extend starts at {start}")
        self._crop(start)  # drop drafted keys before adding committed positions
        device = self._device()
        m = aux.shape[0]
        hidden = self.draft.project(aux.to(device).unsqueeze(0))  # [1, m, H]
        ids = torch.as_tensor(list(next_tokens), dtype=torch.long, device=device).unsqueeze(0)  # [1, m]
        pos = torch.arange(start, start + m, device=device)
        state = self.draft.step(hidden, ids, pos, self._attends())  # [1, m, H]
        self.last_state = state[:, -1:]
        self.length = start + m

    @torch.no_grad()
    def propose(self, k: int) -> list[int]:
        if self.last_state is None:
            raise RuntimeError("propose() before extend()")
        draft_ids = self.draft.draft_ids()
        state = self.last_state
        t = self.length - 1  # the last committed position (TTT's t); step j runs at rope position t + j
        tokens: list[int] = []
        token = draft_ids[self.draft.logits(state).argmax(-1)]  # [1, 1] target id
        tokens.append(int(token))
        for j in range(1, k):
            pos = torch.tensor([t + j], device=state.device)
            state = self.draft.step(self.draft.carry(state), token, pos, self._attends())
            token = draft_ids[self.draft.logits(state).argmax(-1)]
            tokens.append(int(token))
        self._crop(self.length)  # drafted positions never stay in the caches
        return tokens


def _as_drafter(draft) -> Drafter:
    return Eagle3Drafter(draft) if isinstance(draft, Eagle3Draft) else draft


def _capture_layers(draft) -> list[int]:
    model = draft.draft if isinstance(draft, Eagle3Drafter) else draft
    if not isinstance(model, Eagle3Draft):
        raise ValueError("capture_layers is required with a drafter that is not an Eagle3Draft")
    return list(model.geometry.capture_layers)


def _device(target) -> torch.device:
    return next(target.parameters()).device


def _new_cache(target):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=target.config)
    except TypeError:  # older transformers
        return DynamicCache()


def _finish(tokens: list[int], eos: set[int], max_new_tokens: int) -> tuple[list[int], bool]:
    """Truncate at max_new_tokens, then after the first EOS; say whether generation is over.

    The budget comes first: an accepted chain can carry an EOS past it, which greedy decoding,
    one token per forward, would never have reached.
    """
    kept = tokens[:max_new_tokens]
    for i, tok in enumerate(kept):
        if tok in eos:
            return kept[:i + 1], True
    return kept, len(tokens) >= max_new_tokens


@torch.inference_mode()
def greedy_generate(target, prompt_ids: Sequence[int], max_new_tokens: int,
                    eos_ids: Iterable[int] = ()) -> GenerationResult:
    """Greedy decoding, one token per forward, with the HF KV cache (the lossless reference)."""
    eos = set(int(i) for i in eos_ids)
    device = _device(target)
    start = time.perf_counter()
    tokens: list[int] = []
    forwards = 0
    if max_new_tokens > 0:
        cache = _new_cache(target)
        inputs = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        while True:
            out = target(input_ids=inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
            forwards += 1
            cache = out.past_key_values
            tok = int(out.logits[0, -1].argmax())
            tokens.append(tok)
            if tok in eos or len(tokens) >= max_new_tokens:
                break
            inputs = torch.tensor([[tok]], dtype=torch.long, device=device)
    return GenerationResult(tokens=tokens, wall_s=time.perf_counter() - start, forwards=forwards)


def _aux(hidden_states: Sequence[torch.Tensor], capture_layers: Sequence[int], rows: int) -> torch.Tensor:
    """`[rows, C*H_t]`: the captured residuals of the first `rows` positions of a batch-1 forward."""
    return torch.cat([hidden_states[i][0, :rows] for i in capture_layers], dim=-1)


@torch.inference_mode()
def speculative_generate(target, draft, prompt_ids: Sequence[int], max_new_tokens: int, num_draft_tokens: int,
                         eos_ids: Iterable[int] = (), capture_layers: Sequence[int] | None = None) -> SpecResult:
    """Greedy speculative decoding of one prompt (see the module docstring).

    Args:
        target: An HF causal LM (`use_cache`, `output_hidden_states`, `DynamicCache.crop`).
        draft: An `Eagle3Draft` (wrapped in an `Eagle3Drafter`) or any `Drafter`.
        num_draft_tokens: K >= 1 drafted tokens per verify forward.
        capture_layers: Target capture indices; default the draft geometry's.

    Returns:
        A `SpecResult` whose `tokens` equal `greedy_generate`'s for the same arguments.
    """
    k = int(num_draft_tokens)
    if k < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {k}")
    if capture_layers is None:
        capture_layers = _capture_layers(draft)
    capture_layers = [int(i) for i in capture_layers]
    eos = set(int(i) for i in eos_ids)
    drafter = _as_drafter(draft)
    device = _device(target)
    res = SpecResult(tokens=[], num_draft_tokens=k, reached=[0] * k, accepted=[0] * k)
    start = time.perf_counter()
    if max_new_tokens <= 0:
        return res
    prompt = list(int(i) for i in prompt_ids)
    n = len(prompt)

    t0 = time.perf_counter()
    cache = _new_cache(target)
    out = target(input_ids=torch.tensor([prompt], dtype=torch.long, device=device), past_key_values=cache,
                 use_cache=True, output_hidden_states=True, logits_to_keep=1)
    cache = out.past_key_values
    first = int(out.logits[0, -1].argmax())
    aux = _aux(out.hidden_states, capture_layers, n)
    res.target_s += time.perf_counter() - t0
    seq = prompt + [first]
    output, done = _finish([first], eos, max_new_tokens)

    if not done:
        t0 = time.perf_counter()
        drafter.reset()
        drafter.extend(aux, seq[1:], 0)
        res.draft_s += time.perf_counter() - t0

    while not done:
        length = len(seq)  # target and draft caches hold positions 0 .. length-2
        t0 = time.perf_counter()
        drafts = [int(d) for d in drafter.propose(k)]
        res.draft_s += time.perf_counter() - t0
        if len(drafts) != k:
            raise RuntimeError(f"drafter proposed {len(drafts)} tokens, expected {k}")

        t0 = time.perf_counter()
        chain = torch.tensor([[seq[-1]] + drafts], dtype=torch.long, device=device)
        out = target(input_ids=chain, past_key_values=cache, use_cache=True, output_hidden_states=True)
        cache = out.past_key_values
        greedy = out.logits[0].argmax(-1).tolist()  # [K+1]: target's choice for tokens length .. length+K
        a = 0
        while a < k and drafts[a] == greedy[a]:
            a += 1
        committed = drafts[:a] + [greedy[a]]
        # Keep positions 0 .. length-1+a (the fed token and the accepted drafts). A negative crop
        # removes that many entries (transformers 4.x and 5.x alike; 5.x deprecates positive ones).
        if k - a:
            cache.crop(-(k - a))
        if cache.get_seq_length() != length + a:
            raise RuntimeError(f"target cache holds {cache.get_seq_length()} positions after crop, "
                               f"expected {length + a}")
        aux = _aux(out.hidden_states, capture_layers, a + 1)
        res.target_s += time.perf_counter() - t0

        res.verify_forwards += 1
        res.accepted_per_verify.append(a)
        for i in range(min(a + 1, k)):
            res.reached[i] += 1
        for i in range(a):
            res.accepted[i] += 1
        seq += committed
        before = len(output)
        output, done = _finish(output + committed, eos, max_new_tokens)
        res.emitted_per_verify.append(len(output) - before)

        if not done:
            t0 = time.perf_counter()
            drafter.extend(aux, committed, length - 1)
            res.draft_s += time.perf_counter() - t0

    res.tokens = output
    res.wall_s = time.perf_counter() - start
    return res


ACCEPT_LENGTH_DEFINITION = ("output tokens committed by verify forwards / verify forwards (the prefill's "
                            "first token counts in neither; after EOS / max_new_tokens truncation)")


def _rates(num: Sequence[int], den: Sequence[int] | int) -> list[float]:
    dens = [den] * len(num) if isinstance(den, int) else list(den)
    return [float(a) / d if d else 0.0 for a, d in zip(num, dens, strict=True)]


def evaluate_speculative(target, draft, prompts: Sequence[Sequence[int]], ks: Sequence[int] = (3, 5),
                         max_new_tokens: int = 128, eos_ids: Iterable[int] = (),
                         capture_layers: Sequence[int] | None = None, check_lossless: bool = True,
                         warmup: bool = True) -> dict[str, dict]:
    """Greedy baseline (once per prompt) and speculative decoding for each K on every prompt.

    Returns:
        `{str(K): result}` (JSON-serialisable; string keys so the dict survives a JSON round trip).
        Each result is self-contained: pooled `accept_length` (verify tokens / verify forwards,
        prefill token excluded), `sglang_accept_length` (prefill token included),
        `accept_length_untruncated` (1 + drafts accepted per verify), `accept_length_mean_per_prompt`,
        per-position `acceptance_rate` (conditional on the prefix accepted, comparable to TTT acc_k)
        and `acceptance_rate_marginal`, raw `counts`, `tokens_per_s` / `baseline_tokens_per_s`,
        `speedup` (baseline wall / speculative wall, pooled), `wall_s` / `draft_s` / `target_s`,
        `baseline` totals, `num_prompts`, `max_new_tokens`, `lossless` / `first_mismatch` (prompt
        index) / `mismatches` (None when `check_lossless` is off).
    """
    eos = [int(i) for i in eos_ids]
    ks = [int(x) for x in ks]
    drafter = _as_drafter(draft)
    if capture_layers is None:
        capture_layers = _capture_layers(draft)
    prompts = [list(p) for p in prompts]
    bar: Progress[None] = progress(None, total=len(prompts) * (1 + len(ks)), desc="eval: greedy and speculative",
                                   unit="generation")  # minutes on a real target: timed lines in a batch log
    try:
        with torch.inference_mode():
            if warmup and prompts:  # first calls pay allocator / kernel selection costs
                greedy_generate(target, prompts[0], min(4, max_new_tokens), eos)
                speculative_generate(target, drafter, prompts[0], min(4, max_new_tokens), ks[0], eos, capture_layers)
            baseline = []
            for p in prompts:
                baseline.append(greedy_generate(target, p, max_new_tokens, eos))
                bar.update()
            base_tokens = sum(len(r.tokens) for r in baseline)
            base_wall = sum(r.wall_s for r in baseline)
            base = {"tokens": base_tokens, "wall_s": base_wall, "forwards": sum(r.forwards for r in baseline),
                    "tokens_per_s": base_tokens / base_wall if base_wall > 0 else 0.0}
            report: dict[str, dict] = {}
            for k in ks:
                results = []
                for p in prompts:
                    results.append(speculative_generate(target, drafter, p, max_new_tokens, k, eos, capture_layers))
                    bar.update()
                mismatches = [i for i, (b, s) in enumerate(zip(baseline, results, strict=True)) if b.tokens != s.tokens]
                verifies = sum(r.verify_forwards for r in results)
                verify_tokens = sum(r.verify_tokens for r in results)
                tokens = sum(len(r.tokens) for r in results)
                accepted_drafts = sum(sum(r.accepted_per_verify) for r in results)
                reached = [sum(r.reached[i] for r in results) for i in range(k)]
                accepted = [sum(r.accepted[i] for r in results) for i in range(k)]
                wall = sum(r.wall_s for r in results)
                per_prompt = [r.accept_length for r in results if r.verify_forwards]
                report[str(k)] = {
                    "num_draft_tokens": k,
                    "num_prompts": len(prompts),
                    "max_new_tokens": int(max_new_tokens),
                    "accept_length_definition": ACCEPT_LENGTH_DEFINITION,
                    "accept_length": verify_tokens / verifies if verifies else 1.0,
                    "sglang_accept_length": tokens / verifies if verifies else 0.0,
                    "accept_length_untruncated": 1.0 + accepted_drafts / verifies if verifies else 1.0,
                    "accept_length_mean_per_prompt": sum(per_prompt) / len(per_prompt) if per_prompt else 1.0,
                    "acceptance_rate": _rates(accepted, reached),
                    "acceptance_rate_marginal": _rates(accepted, verifies),
                    "counts": {"verify_forwards": verifies, "verify_tokens": verify_tokens, "tokens": tokens,
                               "accepted_drafts": accepted_drafts, "reached": reached, "accepted": accepted},
                    "wall_s": wall,
                    "draft_s": sum(r.draft_s for r in results),
                    "target_s": sum(r.target_s for r in results),
                    "tokens_per_s": tokens / wall if wall > 0 else 0.0,
                    "baseline_tokens_per_s": base["tokens_per_s"],
                    "baseline": dict(base),
                    "speedup": base_wall / wall if wall > 0 else 0.0,
                    "lossless": (not mismatches) if check_lossless else None,
                    "first_mismatch": (mismatches[0] if mismatches else None) if check_lossless else None,
                    "mismatches": len(mismatches) if check_lossless else None,
                }
    finally:
        bar.close()
    return report
