"""Demo datasets over the held-out split: a prompt-only track and a target-native track.

They mirror the two kinds of real EAGLE-3 training data for Kimi-K2.5:

* ``demo_prompts``: ShareGPT-schema conversations whose responses were written by *someone
  else* (here a terse rule-based writer, no think blocks). Only the prompts are meant to be
  used; the pipeline regenerates responses through the target.
* ``demo_native``: OpenAI ``messages`` whose every assistant turn was sampled from the demo
  target itself (reasoning, tool calls, answers), like the Kimi-native datasets used as is.

Both draw prompts from *held-out* modules only, so a draft trained on them is measured on text
the target never trained on. Both are deterministic infinite streams cut to a prefix: record
``i`` for a seed never depends on ``num_samples`` (the "nested" property the data stages rely on
when a run is scaled up). They only return records; the stage machinery writes files.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from eagle3.chat_formats.kimi import parse_kimi_assistant
from eagle3.demo import conversations as convs
from eagle3.demo import corpus

_SHAREGPT_ROLE = {"system": "system", "user": "human", "assistant": "gpt"}


#: `dataset.sources.<name>.generator`: the built-in demo sets, in their real schemas.
DEMO_NATIVE, DEMO_PROMPTS = "demo_native", "demo_prompts"


def _unique_plans(stream: str, seed: int) -> Iterator[convs.Plan]:
    """Held-out plans without end, skipping any whose visible text repeats an earlier one."""
    records = corpus.split_records("held_out")
    seen: set[str] = set()
    for j in itertools.count():
        plan = convs.draw_plan(random.Random(f"{stream}:{seed}:{j}"), records)
        key = plan.key()
        if key not in seen:
            seen.add(key)
            yield plan


def _meta(plan: convs.Plan) -> dict:
    return {"kind": plan.kind, "functions": [corpus.record_key(r) for _, r, _ in plan.turns]}


def _terse_answer(answer_kind: str, rec: dict) -> str:
    """A deliberately different voice from the target's: no reasoning, no prose framing."""
    if answer_kind == "explain":
        return f"{rec['signature']} -- {rec['doc']}"
    if answer_kind == "call":
        return convs.call_example(rec).replace("\n\n", "\n")
    if answer_kind == "tool":
        return f"{rec['path']}:\n{rec['source']}"
    return f"{rec['path']}:{rec['lineno']}"


def demo_prompts_records(num_samples: int, seed: int) -> Iterator[dict]:
    """The first ``num_samples`` records of the prompt-only stream for ``seed``.

    Yields:
        ``{"id", "conversations": [{"from": "system"|"human"|"gpt", "value"}], "meta"}``; ids are
        ``demo_prompts-000000`` onwards and are stable for a seed. ``meta`` names the functions
        asked about (used to check the held-out property).
    """
    for i, plan in enumerate(itertools.islice(_unique_plans("prompts", seed), num_samples)):
        turns = [{"from": "system", "value": plan.system}] if plan.system else []
        for answer_kind, rec, user_text in plan.turns:
            turns.append({"from": "human", "value": user_text})
            turns.append({"from": "gpt", "value": _terse_answer(answer_kind, rec)})
        yield {"id": f"demo_prompts-{i:06d}", "conversations": turns, "meta": _meta(plan)}


@functools.lru_cache(maxsize=2)
def load_target(path: str, trust_remote_code: bool = False):
    """Model and tokenizer, loaded once per process (float32: portable and fast enough on CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    import torch  # here: importing this module must stay torch-free

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tokenizer


def run_read_file(arguments: str) -> str:
    """Execute the demo ``read_file`` tool for real, against the held-out corpus snippets."""
    try:
        args = json.loads(arguments)
        path, symbol = str(args["path"]), str(args["symbol"])
    except (ValueError, KeyError, TypeError):
        return "Error: read_file expects JSON arguments {\"path\": ..., \"symbol\": ...}"
    source = corpus.find_source(path, symbol)
    return source if source is not None else f"Error: no symbol {symbol!r} in {path!r}"


def _generate(model, tokenizer, prompts: list[dict], max_new_tokens: int, temperature: float,
              seed: int) -> list[str]:
    """One batched step through the `hf` generation backend (the code stage generate runs).

    Left padding, `<|im_end|>` as end of turn, seeded sampling under a forked RNG, top-k off:
    one implementation for the demo-native answers and the regenerated prompt-only ones.

    Returns:
        Each row's raw completion, through `<|im_end|>` when the turn ended.
    """
    from eagle3.generation.hf_backend import HFBackend
    from eagle3.generation.types import GenerationRequest, SamplingParams

    backend = HFBackend.from_loaded(model, tokenizer)
    requests = [GenerationRequest(id=str(i), messages=p["messages"], tools=p.get("tools"))
                for i, p in enumerate(prompts)]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed)
    results = backend.generate(requests, params)
    for result in results:
        if result.error:
            raise RuntimeError(f"demo_native: request {result.id} not generated ({result.error})")
    return [result.text or "" for result in results]


def _run_batch(model, tokenizer, plans: list[convs.Plan], batch_seed: str, max_new_tokens: int,
               temperature: float, max_tool_rounds: int = 2) -> list[dict]:
    """Play every plan's user turns against the target, executing tool calls, in lock-step rounds."""
    states: list[dict[str, Any]] = []
    for plan in plans:
        messages = [{"role": "system", "content": plan.system}] if plan.system else []
        users = [u for _, _, u in plan.turns]
        messages.append({"role": "user", "content": users[0]})
        states.append({"messages": messages, "users": users[1:], "tools": plan.tools,
                       "tool_rounds": 0, "truncated": 0, "done": False})
    for round_idx in itertools.count():
        active = [s for s in states if not s["done"]]
        if not active:
            break
        seed = int.from_bytes(random.Random(f"{batch_seed}:{round_idx}").randbytes(4), "little")
        outs = _generate(model, tokenizer, active, max_new_tokens, temperature, seed)
        for state, text in zip(active, outs, strict=True):
            msg = parse_kimi_assistant(text)
            state["truncated"] += not text.endswith(tokenizer.eos_token)
            state["messages"].append(msg)
            if msg.get("tool_calls") and state["tool_rounds"] < max_tool_rounds:
                state["tool_rounds"] += 1
                for call in msg["tool_calls"]:
                    result = (run_read_file(call["function"]["arguments"])
                              if call["function"]["name"] == "read_file" else "Error: unknown tool")
                    state["messages"].append({"role": "tool", "tool_call_id": call["id"], "content": result})
            elif state["users"]:
                state["messages"].append({"role": "user", "content": state["users"].pop(0)})
            else:
                state["done"] = True
    return states


def demo_native_records(num_samples: int, seed: int, target_path: str | Path = corpus.DEMO_TARGET_PATH,
                        batch_size: int = 8, max_new_tokens: int = 256,
                        temperature: float = 0.7, skip_ids: Collection[str] = (),
                        trust_remote_code: bool = False) -> Iterator[dict]:
    """The first ``num_samples`` records of the target-native stream for ``seed``.

    Batches are fixed slices of the plan stream (records ``k*batch_size ..``), always generated
    whole, so a record's padding, and hence its sampled text, never depends on ``num_samples``.
    Determinism therefore holds for a given ``(seed, batch_size, max_new_tokens, temperature)``,
    target and torch build.

    A batch whose ids are all in ``skip_ids`` (done by an earlier, killed run) is not generated;
    its records are yielded as ``{"id"}`` alone so the caller can still count them.

    Yields:
        ``{"id", "messages", "tools"?, "meta"}`` with assistant turns carrying
        ``reasoning_content`` and, for tool use, ``tool_calls`` answered by real ``tool`` turns.
    """
    model, tokenizer = load_target(str(target_path), trust_remote_code)
    skip = set(skip_ids)
    plans = _unique_plans("native", seed)
    emitted = 0
    for batch_idx in itertools.count():
        if emitted >= num_samples:
            return
        batch = list(itertools.islice(plans, batch_size))
        ids = [f"demo_native-{emitted + k:06d}" for k in range(len(batch))]
        if all(rid in skip for rid in ids[: num_samples - emitted]):
            for rid in ids[: num_samples - emitted]:
                yield {"id": rid}
            emitted += len(ids[: num_samples - emitted])
            continue
        states = _run_batch(model, tokenizer, batch, f"native:{seed}:{batch_idx}",
                            max_new_tokens, temperature)
        for plan, state in zip(batch, states, strict=True):
            if emitted >= num_samples:
                return
            record = {"id": f"demo_native-{emitted:06d}", "messages": state["messages"]}
            if plan.tools:
                record["tools"] = plan.tools
            record["meta"] = {**_meta(plan), "truncated_turns": state["truncated"]}
            yield record
            emitted += 1


def write_demo_source(out: Any, generator: str, num_samples: int, seed: int, target_path: Path,
                      output_name: str, trust_remote_code: bool = False) -> None:
    """Generate a demo source's records into `out` (resumable by id: done ids are not regenerated).

    A demo_native turn cut at max_new_tokens is rejected (`length_cut`): closed by the template,
    not by the target, it would teach as target-native data an end-of-turn the target never wrote.
    """
    from eagle3.artifacts import progress

    records = out.records(output_name)  # opened first: its earlier records are part of done_ids
    if generator == DEMO_PROMPTS:
        stream = demo_prompts_records(num_samples, seed)
    else:
        stream = demo_native_records(num_samples, seed, target_path, skip_ids=set(out.done_ids),
                                     trust_remote_code=trust_remote_code)
    for record in progress(stream, total=num_samples, desc=f"demo_data {out.name}"):
        out.count_in()
        if out.is_done(record["id"]):
            continue
        cut = (record.get("meta") or {}).get("truncated_turns", 0)
        if cut:
            out.reject(record["id"], "length_cut", f"{cut} assistant turn(s) hit max_new_tokens")
        else:
            records.write(record)
