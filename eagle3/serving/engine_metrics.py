"""Speculative-decoding counters of the engines, and the accept length they imply (no I/O).

Accept length = tokens committed per target forward under speculation, the prefill's token
excluded -- as `stage=eval` counts it:

* vLLM: deltas of `/metrics` (Prometheus text) over the measured requests,
  `1 + vllm:spec_decode_num_accepted_tokens_total / vllm:spec_decode_num_drafts_total` (each
  draft round is one target forward that commits the accepted tokens plus one);
* SGLang: per request `meta_info`, `sum(completion_tokens - 1) / sum(spec_verify_ct)`
  (`completion_tokens / spec_verify_ct` would count the prefill's token too), or else
  `/get_server_info` `internal_states[i].avg_spec_accept_length`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

__all__ = ["ACCEPT_LENGTH_DEFINITION", "parse_prometheus", "sglang_accept_length_from_meta",
           "sglang_accept_length_from_server_info", "vllm_accept_length", "vllm_spec_counters"]

VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_SPEC_COUNTERS = (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED)
ACCEPT_LENGTH_DEFINITION = ("tokens committed per target forward under speculation, the prefill's token "
                            "excluded (as stage=eval counts it)")


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: `(name, labels, value)`; comments skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE_RE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        labels = dict(_LABEL_RE.findall(match.group(3) or ""))
        samples.append((match.group(1), labels, value))
    return samples


def vllm_spec_counters(text: str) -> dict[str, Any]:
    """vLLM's speculative-decoding counters from `/metrics`, summed over engines and models.

    Returns:
        `{"drafts", "draft_tokens", "accepted"}` (None where the server does not expose the
        counter, e.g. no speculation configured) and `"accepted_per_pos"`: position -> count.
    """
    totals: dict[str, Optional[float]] = {name: None for name in VLLM_SPEC_COUNTERS}
    per_pos: dict[int, float] = {}
    for name, labels, value in parse_prometheus(text):
        if name in totals:
            totals[name] = (totals[name] or 0.0) + value
        elif name == VLLM_ACCEPTED_PER_POS and "position" in labels:
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    return {"drafts": totals[VLLM_DRAFTS], "draft_tokens": totals[VLLM_DRAFT_TOKENS],
            "accepted": totals[VLLM_ACCEPTED], "accepted_per_pos": dict(sorted(per_pos.items()))}


def vllm_accept_length(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """Accept length from two `vllm_spec_counters` snapshots around the measured requests.

    `accept_length = 1 + accepted / drafts`: every draft round is one verify forward of the
    target, committing the accepted draft tokens plus one token of its own. None when the
    counters are missing or no draft round happened.
    """
    def delta(key: str) -> Optional[float]:
        if after.get(key) is None:
            return None
        return float(after[key]) - float(before.get(key) or 0.0)

    drafts, draft_tokens, accepted = delta("drafts"), delta("draft_tokens"), delta("accepted")
    result: dict[str, Any] = {"source": "vllm /metrics", "drafts": drafts, "draft_tokens": draft_tokens,
                              "accepted": accepted, "accept_length": None, "acceptance_rate": None,
                              "acceptance_per_position": []}
    if drafts is None or accepted is None or drafts <= 0:
        return result
    result["accept_length"] = 1.0 + accepted / drafts
    if draft_tokens:
        result["acceptance_rate"] = accepted / draft_tokens
    pos_before = before.get("accepted_per_pos") or {}
    per_pos = after.get("accepted_per_pos") or {}
    # Fraction of draft rounds whose position-p draft was accepted (p = 0 first).
    result["acceptance_per_position"] = [(float(v) - float(pos_before.get(p, 0.0))) / drafts
                                         for p, v in sorted(per_pos.items())]
    return result


def sglang_accept_length_from_meta(meta_infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Accept length from SGLang's per-request `meta_info` (native `/generate` responses).

    `sum(completion_tokens - 1) / sum(spec_verify_ct)` over the requests that had a verify
    step: the prefill's token is not committed by a verify forward. None without any.
    """
    tokens = verifies = requests = 0
    for meta in meta_infos:
        verify = meta.get("spec_verify_ct")
        completion = meta.get("completion_tokens")
        if verify is None or completion is None or int(verify) <= 0:
            continue
        tokens += int(completion) - 1
        verifies += int(verify)
        requests += 1
    return {"source": "sglang meta_info", "requests": requests, "verify_forwards": verifies,
            "committed_tokens": tokens, "accept_length": (tokens / verifies) if verifies else None}


def sglang_accept_length_from_server_info(info: Mapping[str, Any]) -> Optional[float]:
    """`/get_server_info` `internal_states[i].avg_spec_accept_length`, averaged over the
    data-parallel ranks that report one; None when none does (speculation off)."""
    states = info.get("internal_states") or []
    if isinstance(states, Mapping):
        states = [states]
    values = [float(s["avg_spec_accept_length"]) for s in states
              if isinstance(s, Mapping) and s.get("avg_spec_accept_length") is not None]
    return sum(values) / len(values) if values else None
