"""Capture the residual stream entering chosen decoder layers, with hooks, in padded batches.

Capture index i is "the residual stream entering decoder layer i", which is exactly what
transformers returns as `output_hidden_states[i]` and what SGLang calls `layers_to_capture`
(docs/design.md, 'Capture layer ids'). A forward *pre*-hook on layer i sees that tensor as the
layer's first input, so no layer-output bookkeeping (where off-by-one errors live) is needed.
The teacher signal is the output of the final norm (`output_hidden_states[-1]`).
`output_hidden_states=True` is not used: it would keep all L+1 states of a batch alive
(61 x [tokens, 7168] for Kimi).

Batches are right-padded with an attention mask; position ids count from 0 in every row, so a
real token sees exactly what it would see alone, and each sample is sliced to its real length
before anything is stored. Results match an unbatched forward only up to fp32 kernel rounding
(~1e-6; CPU GEMM and attention kernels block differently for different shapes); for one batch
composition they equal transformers' own hidden states bit for bit (tests pin both).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from eagle3.target.decoder import DecoderParts


class LayerCapture:
    """Hooks on a target's capture layers and final norm; use as a context manager.

    Args:
        parts: The target's decoder parts (see target.find_decoder).
        capture_layers: Capture ids, each in [0, num_layers - 1].
    """

    def __init__(self, parts: DecoderParts, capture_layers: Sequence[int]) -> None:
        n = len(parts.layers)
        bad = [i for i in capture_layers if not 0 <= int(i) < n]
        if bad:
            raise ValueError(f"capture layers {bad} out of range for a {n}-layer target (valid: 0..{n - 1})")
        self.parts = parts
        self.capture_layers = [int(i) for i in capture_layers]
        self._handles: list = []
        self._captured: dict[int, torch.Tensor] = {}
        self._final: torch.Tensor | None = None
        embedding = next(m for m in parts.base.children() if isinstance(m, nn.Embedding))
        self.input_device = embedding.weight.device

    def _pre_hook(self, index: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]  # [B, T, H]
            # A copy on the CPU: later layers must not be able to modify it in place, and on a
            # GPU the store needs it on the host anyway.
            self._captured[index] = hidden.detach().to("cpu", copy=True)
        return hook

    def _norm_hook(self, module, args, output):
        out = output[0] if isinstance(output, tuple) else output  # [B, T, H]
        self._final = out.detach().to("cpu", copy=True)

    def __enter__(self) -> LayerCapture:
        for i in self.capture_layers:
            self._handles.append(self.parts.layers[i].register_forward_pre_hook(self._pre_hook(i), with_kwargs=True))
        self._handles.append(self.parts.norm.register_forward_hook(self._norm_hook))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of the decoder.

        Args:
            input_ids: `[B, T]` right-padded token ids.
            attention_mask: `[B, T]` 1 for real tokens, 0 for padding.

        Returns:
            (`aux [B, T, C*H]` in capture order, `final [B, T, H]`), on the CPU, in the
            target's dtype.
        """
        if not self._handles:
            raise RuntimeError("LayerCapture.run needs the hooks: use it inside `with`")
        self._captured.clear()
        self._final = None
        self.parts.base(input_ids=input_ids.to(self.input_device),
                        attention_mask=attention_mask.to(self.input_device), use_cache=False)
        missing = [i for i in self.capture_layers if i not in self._captured]
        if missing or self._final is None:
            raise RuntimeError(f"hooks did not fire (layers {missing}, final norm "
                               f"{'ok' if self._final is not None else 'missing'}): the decoder "
                               "forward does not call its layers / norm as modules")
        aux = torch.cat([self._captured[i] for i in self.capture_layers], dim=-1)  # [B, T, C*H]
        final, self._final = self._final, None
        self._captured.clear()
        return aux, final


def pad_batch(seqs: Sequence[Sequence[int] | np.ndarray], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: (`input_ids [B, T]`, `attention_mask [B, T]`), T = longest."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # [B, T]
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.as_tensor(np.asarray(seq), dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def capture_samples(capture: LayerCapture, seqs: Sequence[Sequence[int] | np.ndarray],
                    pad_id: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run one padded batch and cut it back into samples: [(`aux [n, C*H]`, `final [n, H]`)]."""
    ids, mask = pad_batch(seqs, pad_id)
    aux, final = capture.run(ids, mask)  # [B, T, C*H], [B, T, H]
    return [(aux[row, : len(seq)], final[row, : len(seq)]) for row, seq in enumerate(seqs)]


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Greedy token-budget batches over samples already sorted longest first.

    A batch costs rows x its longest (first) sample in padded tokens and stays within
    `batch_tokens`; a sample longer than the budget runs alone. Greedy packing of a sorted list
    has a property resume relies on: after the first k batches are done, packing the rest
    reproduces batches k+1.. exactly, so a resumed run computes the same batches as an
    uninterrupted one.

    Returns:
        Lists of positions into `lengths`.
    """
    if any(a < b for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError("plan_batches needs lengths sorted longest first")
    batches: list[list[int]] = []
    for pos, _ in enumerate(lengths):
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(pos)
        else:
            batches.append([pos])
    return batches
