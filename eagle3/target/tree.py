"""The target's final states along many short branches off one sample, in few forwards (a prefix tree).

Re-scoring draft chains (`train.ttt_chains=rescored`, `eagle3.draft.rescoring`) asks the target for its
next-token distribution after prefixes the data never held: the sample's tokens up to a chain's start,
then the tokens the draft drafted. One forward per prefix would cost a target forward per chain and step;
here the sample's tokens and every branch's tokens share one sequence, and a 4-D attention mask gives
each branch token exactly its own prefix (the sample's tokens through its branch point, then its branch
up to itself), with the rope position it would have had. transformers takes such a mask as given on the
decoder families this project serves (Llama, Qwen 2, Gemma 3, DeepSeek-V3's MLA: tests pin each against
forwards of the explicit prefixes).

A sliding-window layer would read the whole mask as given, so a sample longer than the target's window
is refused rather than scored with more context than the target sees.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from eagle3.target.decoder import DecoderParts, text_config

#: Branch tokens scored per forward: the mask grows with the square of (sample + branch tokens).
NODES_PER_FORWARD = 2048


def sliding_window(config: Any) -> Optional[int]:
    """The attention window of a target whose layers slide (Gemma 3, Mistral), else None."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def tree_mask(length: int, branch_at: torch.Tensor, depth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(mask [M, M] bool, positions [M])` for a sample of `length` tokens plus N branch nodes.

    Node n continues the sample's prefix `0..branch_at[n]` at branch depth `depth[n]` (0 = the first token
    after the prefix); a branch's nodes are consecutive, depth 0 first. Node n attends to the prefix and
    to the nodes of its branch at depth <= its own; it sits at rope position `branch_at[n] + 1 + depth[n]`.
    """
    nodes = branch_at.numel()
    device = branch_at.device
    base = torch.arange(length, device=device)
    branch_id = torch.cumsum((depth == 0).long(), 0)  # [N] which branch each node is on
    mask = torch.zeros(length + nodes, length + nodes, dtype=torch.bool, device=device)
    mask[:length, :length] = base.unsqueeze(1) >= base.unsqueeze(0)  # the sample: causal
    mask[length:, :length] = base.unsqueeze(0) <= branch_at.unsqueeze(1)  # a node: its prefix
    same_branch = branch_id.unsqueeze(1) == branch_id.unsqueeze(0)
    mask[length:, length:] = same_branch & (depth.unsqueeze(0) <= depth.unsqueeze(1))
    positions = torch.cat([base, branch_at + 1 + depth])
    return mask, positions


class TreeScorer:
    """A loaded target (`DecoderParts`) that returns its final states (after the final norm) at branch nodes."""

    def __init__(self, parts: DecoderParts, text_config_key: Optional[str] = None,
                 nodes_per_forward: int = NODES_PER_FORWARD) -> None:
        self.parts = parts
        self.window = sliding_window(text_config(parts.base.config, text_config_key))
        self.nodes_per_forward = nodes_per_forward

    @torch.no_grad()
    def final_states(self, tokens: torch.Tensor, branch_at: torch.Tensor, branch_tokens: torch.Tensor,
                     depth: torch.Tensor) -> torch.Tensor:
        """`[N, H]` the target's final state at each node, the state its lm_head reads for the token after.

        Args:
            tokens: `[n]` the sample's token ids. branch_at / branch_tokens / depth: `[N]` per node, its
                branch point (the last sample token of its prefix), its token, its depth (`tree_mask`).
        """
        length = tokens.numel()
        deepest = int(depth.max()) if depth.numel() else 0
        if self.window is not None and length + deepest + 1 > self.window:
            raise ValueError(f"train.ttt_chains=rescored: a sample of {length} tokens is longer than the "
                             f"target's sliding window ({self.window}); its branches would see context the "
                             "target does not; train on shorter samples or with train.ttt_chains=all")
        device = self.parts.device
        out = []
        for start, stop in _whole_branches(depth, self.nodes_per_forward):
            mask, positions = tree_mask(length, branch_at[start:stop], depth[start:stop])
            ids = torch.cat([tokens, branch_tokens[start:stop]]).unsqueeze(0).to(device)
            hidden = self.parts.base(input_ids=ids, attention_mask=mask[None, None].to(device),
                                     position_ids=positions.unsqueeze(0).to(device), use_cache=False)
            out.append(hidden.last_hidden_state[0, length:])  # [n_nodes, H]
        if not out:
            return torch.zeros(0, self.parts.hidden_size, dtype=next(self.parts.base.parameters()).dtype)
        return torch.cat(out)


def _whole_branches(depth: torch.Tensor, budget: int) -> list[tuple[int, int]]:
    """Node ranges of at most `budget` nodes (or one branch, if longer) that never split a branch."""
    starts = (depth == 0).nonzero().squeeze(1).tolist() + [depth.numel()]
    ranges: list[tuple[int, int]] = []
    begin = 0
    for here, after in zip(starts[:-1], starts[1:], strict=True):
        if after - begin > budget and here > begin:
            ranges.append((begin, here))
            begin = here
    if depth.numel() > begin:
        ranges.append((begin, depth.numel()))
    return ranges
