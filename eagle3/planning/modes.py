"""Store, online and hybrid hidden states, side by side (the plan's `hidden_states` section).

The two modes trade disk for target compute. Store mode runs the target once over the mix
(extract) and keeps 2-4 KiB per token per captured layer; online mode keeps nothing but runs the
target again for every epoch and every validation. Which wins depends on the epochs, the disk
and how fast the target's prefill is, so the plan shows both with the same inputs: bytes
stored, target forward passes (samples and tokens), and wall-time estimates from throughputs
measured by earlier runs (`extract_tokens_per_s` in extract manifests, `train_tokens_per_s` in
train manifests). A rate measured on this very unit is `actual`; one measured by another run of
the same target, capture layers and backend (extract) or draft and batch (train) - a 10K run
before the 100K one - is an `estimate` and names the directory it came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import MANIFEST_NAME, STATUS_COMPLETE, Manifest
from eagle3.config.schema import Eagle3Config
from eagle3.config.slices import fingerprinted
from eagle3.draft.options import HIDDEN_STATE_MODES, HYBRID, ONLINE, STORE
from eagle3.engines import IN_PROCESS
from eagle3.errors import MissingInput
from eagle3.planning import figures
from eagle3.planning.figures import Figure
from eagle3.planning.forwards import forward_passes
from eagle3.planning.view import ChainView

__all__ = ["hidden_state_modes"]


def _rate(value: Optional[float], basis: str, note: str) -> Optional[Figure]:
    return None if not value else Figure(round(float(value), 1), basis, note)


def _complete_manifests(stage_dir: Path) -> list[Manifest]:
    """Complete manifests of a stage, newest first (damaged ones are skipped: this is a plan).

    Callers put the unit's own directory first (`_own_first`): its rate is the one measured here.
    """
    found = []
    for path in stage_dir.glob(f"*/{MANIFEST_NAME}"):
        try:
            manifest = Manifest.load(path.parent)
        except Exception:  # noqa: BLE001 - a damaged neighbour must not stop a plan
            continue
        if manifest.status == STATUS_COMPLETE:
            found.append(manifest)
    return sorted(found, key=lambda m: str(m.completed_at or ""), reverse=True)


def _own_first(manifests: list[Manifest], own: Optional[Path]) -> list[Manifest]:
    return sorted(manifests, key=lambda m: own is None or m.dir != own)  # stable: newest first after it


class _Rates:
    """Measured throughputs of earlier runs that apply to this config's target and draft."""

    def __init__(self, config: Eagle3Config, root: Path, states: dict[str, Any]):
        self.config, self.states = config, states
        self.extracts = _complete_manifests(root / "extract")
        self.trains = _complete_manifests(root / "train")

    @staticmethod
    def _first(manifests: list[Manifest], own: Optional[Path], key: str, applies, alike: str) -> Optional[Figure]:
        """`extra[key]` of the unit's own manifest if it has one, else of the newest that `applies`."""
        for m in _own_first(manifests, own):
            if applies(m) and m.extra.get(key):
                own_unit = own is not None and m.dir == own
                return _rate(m.extra[key], "actual" if own_unit else "estimate",
                             f"{key} of {m.dir}" + ("" if own_unit else f" ({alike})"))
        return None

    def extract(self, backend: str, own: Optional[Path]) -> Optional[Figure]:
        """Extraction tokens/s of `backend` on this target and capture layers."""
        def applies(m: Manifest) -> bool:
            return (m.config.get("backend", IN_PROCESS) == backend and m.config.get("target") == self.states["target"]
                    and list(m.config.get("capture_layers", [])) == self.states["capture_layers"])

        return self._first(self.extracts, own, "extract_tokens_per_s", applies,
                           f"same target, layers, backend {backend}")

    def train(self, mode: str, own: Optional[Path]) -> Optional[Figure]:
        """Training tokens/s in `mode` for this draft and batch (online: also this state source)."""
        draft = fingerprinted(self.config.model.draft)  # as train's fingerprint holds it
        batch = self.config.train.batch_tokens

        def applies(m: Manifest) -> bool:
            return (m.extra.get("hidden_states", STORE) == mode and m.config.get("draft") == draft
                    and m.config.get("train", {}).get("batch_tokens") == batch
                    and (mode == STORE or m.config.get("states") == self.states))

        return self._first(self.trains, own, "train_tokens_per_s", applies, "same draft and batch")


def _seconds(tokens: Figure, rate: Optional[Figure], note: str) -> Figure:
    if rate is None:
        return figures.unknown("no run measured this throughput yet")
    per_s = tokens.value / rate.value if tokens.value is not None and rate.value is not None else None
    return figures.derive(per_s, tokens, rate, basis="estimate", note=note)


def _capped(stored: Figure, cap_gb: Optional[float]) -> Figure:
    """The store's bytes under `train.hybrid_store_gb`."""
    if cap_gb is None or stored.value is None or stored.value <= cap_gb * 1e9:
        return stored
    return figures.derive(int(cap_gb * 1e9), stored, basis="config",
                          note=f"train.hybrid_store_gb={cap_gb:g}: the rest is computed every epoch")


def _serial_rate(a: Optional[Figure], b: Optional[Figure]) -> Optional[Figure]:
    """Tokens/s of doing both per token one after the other (no overlap: an upper bound on time)."""
    if a is None or b is None or a.value is None or b.value is None:
        return None
    return Figure(round(1.0 / (1.0 / a.value + 1.0 / b.value), 1), "estimate",
                  f"target forward ({a.value:,} tok/s) then draft step ({b.value:,} tok/s) per token, not overlapped")


def _unit_dir(stage: str, chain: ChainView) -> Optional[Path]:
    units = chain.units(stage)
    if not units:
        return None
    try:
        return chain.locate(stage, units[0])[0]
    except MissingInput:
        return None


def hidden_state_modes(config: Eagle3Config, chain: ChainView, mix: dict[str, Figure], store: dict[str, Any],
                       root: Path) -> dict[str, Any]:
    """Both modes' bytes, target forward passes and wall estimates for this config, as plain data.

    Args:
        mix, store: The plan's figures of the mixture and the store (`Planner.mix`, `Planner.store`).
        root: The artifact root, whose earlier manifests measured the rates.
    """
    tr = config.train
    backend = config.extract.backend
    train_epochs = figures.token_epochs(mix["train_tokens"], tr.max_epochs, tr.max_steps)
    args = (tr.max_epochs, tr.max_steps, tr.eval_every_n_epochs)

    rates = _Rates(config, root, chain.states_identity())
    # The units each mode would use (train's fingerprints differ by mode; only store mode extracts).
    modes_chain = {mode: chain.in_mode(mode) for mode in HIDDEN_STATE_MODES}
    extract_rate = rates.extract(backend, _unit_dir("extract", modes_chain[STORE]))
    store_train_rate = rates.train(STORE, _unit_dir("train", modes_chain[STORE]))
    online_train_rate = (rates.train(ONLINE, _unit_dir("train", modes_chain[ONLINE]))
                         or _serial_rate(extract_rate, store_train_rate))

    configured_fmt = store["configured"]
    modes, forward_tokens = {}, {}
    for mode in HIDDEN_STATE_MODES:
        tokens = forward_tokens[mode] = forward_passes(mode, mix["train_tokens"], mix["eval_tokens"], *args)
        samples = forward_passes(mode, mix["train_samples"], mix["eval_samples"], *args)
        entry: dict[str, Any] = {"target_forward_samples": samples, "target_forward_tokens": tokens}
        if mode == STORE:
            entry["bytes_stored"] = store["bytes"][configured_fmt]
            entry["bytes_stored_by_format"] = store["bytes"]
            entry["extract_tokens_per_s"] = extract_rate
            entry["train_tokens_per_s"] = store_train_rate
            extract_s = _seconds(tokens, extract_rate, "target forward tokens / extract tokens/s")
            train_s = _seconds(train_epochs, store_train_rate, "train token-epochs / train tokens/s")
            entry["wall_s"] = {"extract": extract_s, "train": train_s,
                               "total": figures.total([extract_s, train_s], "extract + train")}
        elif mode == HYBRID:
            entry["bytes_stored"] = _capped(store["bytes"][configured_fmt], tr.hybrid_store_gb)
            entry["train_tokens_per_s"] = rates.train(HYBRID, _unit_dir("train", modes_chain[HYBRID]))
            # Epoch 1 computes (online's rate), the later epochs read (store mode's rate).
            first = _seconds(mix["train_tokens"], online_train_rate, "epoch 1: train tokens / online train tokens/s")
            rest_tokens = figures.derive(None if train_epochs.value is None or mix["train_tokens"].value is None
                                         else train_epochs.value - mix["train_tokens"].value,
                                         train_epochs, mix["train_tokens"], basis="estimate")
            rest = _seconds(rest_tokens, store_train_rate, "later epochs: token-epochs / store train tokens/s")
            train_s = figures.total([first, rest], "epoch 1 computed and stored + later epochs read")
            entry["wall_s"] = {"train": train_s, "total": train_s}
        else:
            entry["bytes_stored"] = Figure(0, "config", "online training writes no hidden-state store")
            entry["train_tokens_per_s"] = online_train_rate
            train_s = _seconds(train_epochs, online_train_rate,
                               "train token-epochs / online train tokens/s (the target forward included)")
            entry["wall_s"] = {"train": train_s, "total": train_s}
        modes[mode] = {k: (v.to_dict() if isinstance(v, Figure) else
                           {f: x.to_dict() for f, x in v.items()} if isinstance(v, dict) else v)
                       for k, v in entry.items() if v is not None}
    ratio = None
    s_tok, o_tok = forward_tokens[STORE], forward_tokens[ONLINE]
    if o_tok.value is not None and s_tok.value:
        ratio = round(o_tok.value / s_tok.value, 2)
    return {"configured": tr.hidden_states, "backend": backend, "storage_format": configured_fmt,
            "modes": modes, "online_forward_ratio": ratio}

