"""The plan of the whole chain for a config, before any of it runs (what `stage=plan` prints).

For every chain stage and unit: where the output goes (the same fingerprinted directory the
stage would use: `UnitStage.locate`), whether it is there (complete / running / missing; "after
<stage>" when an input is missing, so the directory cannot be known yet), and what it will cost:
samples, tokens, generated tokens, the hidden-state store in bf16 and fp8, training
token-epochs, and the extract preflight's disk check. Counts come from the manifests of stages
that already ran; the rest is derived from the config and marked with its basis
(`eagle3.planning.figures`). No model, tokenizer or dataset is loaded.

The figures come from the typed config (`Eagle3Config`); what only the stages can answer -- their
units and fingerprinted directories -- comes through a `ChainView`, which the stages implement
(`eagle3.stages.plan.ConfigChain`): the plan must find the very directories the stages would use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import MANIFEST_NAME, REJECTS_NAME, STATUS_RUNNING, STATUS_STOPPED, Manifest
from eagle3.config.schema import DatasetSourceConfig, Eagle3Config
from eagle3.data.conversation import TRACK_PROMPT_ONLY
from eagle3.draft.geometry import MLA_FIELDS, config_geometry
from eagle3.draft.options import ONLINE
from eagle3.draft.shapes import draft_cost
from eagle3.errors import MissingInput
from eagle3.planning import figures
from eagle3.planning.figures import Figure
from eagle3.planning.view import ChainView
from eagle3.target_info import target_config

__all__ = ["FORMAT_VERSION", "ChainView", "Planner", "UnitPlan", "build_plan"]

FORMAT_VERSION = 1
SHOWN_FORMATS = ("bf16", "fp8", "compact")  # always all three: the choice between them is the plan's main lever


@dataclass
class UnitPlan:
    """One unit of one stage in the plan.

    Attributes:
        status: complete | running | stopped (kept none of its input) | missing.
        after: The upstream stage with no complete output yet (then `output` is None: the
            directory's fingerprint covers its inputs, which do not exist yet).
        after_unit: The unit of that upstream stage.
        inputs: Input name -> directory (or the raw origin for prep / demo_data).
        figures: Named figures (`samples`, `tokens`, stage-specific ones).
        other: A short stage-specific summary for the table.
    """

    stage: str
    unit: str
    status: str
    after: Optional[str] = None
    after_unit: Optional[str] = None
    output: Optional[Path] = None
    inputs: dict[str, str] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    other: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "unit": self.unit, "status": self.status, "after": self.after,
                "after_unit": self.after_unit, "output": None if self.output is None else str(self.output),
                "inputs": self.inputs, "figures": {k: f.to_dict() for k, f in self.figures.items()},
                "other": self.other, "notes": self.notes}


def _origin(src: DatasetSourceConfig) -> str:
    if src.generator is not None:
        return f"built-in {src.generator}"
    if src.hub_id is not None:
        return f"hub {src.hub_id}{'/' + src.subset if src.subset else ''} [{src.split}]"
    return "files " + ", ".join(str(p) for p in src.data_files or [])


def locate(chain: ChainView, stage: str, unit: str) -> tuple[UnitPlan, Optional[Manifest]]:
    """Where a unit's output is and whether it is there, without creating anything.

    `UnitStage.locate` gives the directory; `unit_inputs` is asked as well (it is what locate
    fingerprints) so the plan can list the inputs. Both raise MissingInput when an upstream output
    is not complete: then the directory cannot be known yet, and the row says which stage to run.
    """
    try:
        inputs = chain.unit_inputs(stage, unit)
        where, manifest = chain.locate(stage, unit)
    except MissingInput as exc:
        return UnitPlan(stage, unit, "missing", after=exc.stage or "an upstream stage", after_unit=exc.unit,
                        notes=[str(exc)]), None
    row = UnitPlan(stage, unit, "complete" if manifest else "missing", output=where,
                   inputs={k: str(m.dir) for k, m in inputs.items()})
    if manifest is None and (where / MANIFEST_NAME).is_file():
        # locate read this manifest and it is not complete: a run started and has not finished, or
        # kept none of its input and stopped the job (eagle3.stages.intake).
        if Manifest.load(where).status == STATUS_STOPPED:
            row.status = STATUS_STOPPED
            row.notes.append(f"a run kept none of its input and stopped here (its rejects: {where / REJECTS_NAME}); "
                             "a rerun starts it over")
        else:
            row.status = STATUS_RUNNING
            row.notes.append("a run started here and has not finished (or was killed): a rerun resumes it")
    if manifest is not None:
        row.figures["output_bytes"] = Figure(manifest.total_bytes, "actual", "files in the unit directory")
    return row, manifest


class Planner:
    """Walks the chain in order; later stages build on the figures of earlier ones."""

    def __init__(self, config: Eagle3Config, chain: ChainView):
        self.config, self.chain = config, chain
        self.tps = config.extract.assumed_tokens_per_sample
        # Per source: samples after demo_data / prep / generate, (samples, tokens) after tokenize.
        self.raw_samples: dict[str, Figure] = {}
        self.prep_samples: dict[str, Figure] = {}
        self.gen_samples: dict[str, Figure] = {}
        self.tokenized: dict[str, tuple[Figure, Figure]] = {}
        self.mix: dict[str, Figure] = {}
        self.store: dict[str, Any] = {}
        data = config.data
        planned = None if data.scale is None else data.scale + data.eval_size
        self.shares = figures.merge_shares({n: s.weight for n, s in config.dataset.sources.items()}, planned)

    def source(self, unit: str) -> DatasetSourceConfig:
        return self.config.dataset.sources[unit]

    def share_note(self, unit: str) -> str:
        share = self.shares.get(unit)
        return "" if share is None else f"merge uses ~{share:,} (weight {self.source(unit).weight:g})"

    # One method per chain stage: fill row.figures / row.other from the manifest or the config.
    def demo_data(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        n = self.source(row.unit).num_samples
        row.inputs = {"generator": _origin(self.source(row.unit))}
        samples = (Figure(m.counts["out"], "actual") if m else figures.unknown() if n is None else
                   Figure(n, "config", "num_samples (length-cut demo answers are rejected)"))
        self.raw_samples[row.unit] = row.figures["samples"] = samples

    def prep(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        src = self.source(row.unit)
        if src.generator is None:
            row.inputs = {"raw": _origin(src)}
        samples = (Figure(m.counts["out"], "actual") if m else
                   figures.prep_samples(src.num_samples, self.raw_samples.get(row.unit)))
        self.prep_samples[row.unit] = row.figures["samples"] = samples
        row.other = self.share_note(row.unit)

    def generate(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        gen = self.config.generate
        samples = (Figure(m.counts["out"], "actual") if m else figures.at_most(
            self.prep_samples[row.unit], "the prepped conversations (failed requests are rejected)"))
        self.gen_samples[row.unit] = row.figures["samples"] = samples
        to_generate, copied = samples, 0
        if m is None and row.output is not None:  # prep is done: earlier outputs may hold batches
            copied = self.chain.copyable_conversations(row.unit)
            if copied:
                row.figures["copied_from_earlier"] = Figure(
                    copied, "actual", "conversations whose batches earlier generate outputs ran under this config")
                to_generate = figures.derive(samples.value - copied if samples.value is not None else None, samples,
                                              basis=samples.basis, note="prepped conversations not copied")
        one, every = figures.generated_tokens(to_generate, gen.max_new_tokens, gen.max_user_turns)
        if m and "tokens_generated" in m.counts:
            one = every = Figure(m.counts["tokens_generated"], "actual", "tokens the target generated")
        row.figures["generated_tokens_one_turn"], row.figures["generated_tokens_max"] = one, every
        share = self.shares.get(row.unit)
        if not samples.known and share is not None:
            row.figures["generated_tokens_at_share"] = Figure(
                share * gen.max_new_tokens, "estimate",
                f"merge share {share:,} x generate.max_new_tokens; set dataset.sources.{row.unit}.num_samples "
                "to regenerate only what the mix uses (null regenerates the whole source)")
        at_share = row.figures.get("generated_tokens_at_share")
        row.other = (f"generated {one.value:,}" if one.basis == "actual" else f"gen <= {one.value:,}/turn"
                     if one.known else "gen unknown (whole source)") + (
            f"; ~{at_share.value:,}/turn at merge share" if at_share else "") + (
            f"; {copied:,} copied from earlier outputs" if copied else "")

    def tokenize(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        upstream = self.gen_samples if self.source(row.unit).track == TRACK_PROMPT_ONLY else self.prep_samples
        if m:
            samples, tokens = Figure(m.counts["out"], "actual"), Figure(m.counts["tokens"], "actual")
        else:
            samples = figures.at_most(upstream[row.unit], "the conversations (overlength ones may be dropped)")
            tokens = figures.tokens_of(samples, self.tps, "assumed", f"samples x {self.tps:,} tokens/sample")
        row.figures["samples"], row.figures["tokens"] = samples, tokens
        self.tokenized[row.unit] = (samples, tokens)

    def merge(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        if m:
            per_source = m.extra.get("per_source", {}).values()
            mix = {"train_samples": Figure(m.extra["train_samples"], "actual"),
                   "eval_samples": Figure(m.extra["eval_samples"], "actual"),
                   "train_tokens": Figure(m.extra["train_tokens"], "actual"),
                   "eval_tokens": Figure(sum(s.get("eval_tokens", 0) for s in per_source), "actual")}
        else:
            data = self.config.data
            train, evl = figures.mix_split(figures.total(s for s, _ in self.tokenized.values()),
                                            data.scale, data.eval_size)
            toks = list(self.tokenized.values())
            measured = [(s.value, t.value) for s, t in toks
                        if s.basis == t.basis == "actual" and s.value is not None and t.value is not None]
            if toks and len(measured) == len(toks) and sum(n for n, _ in measured):
                mean, basis = sum(t for _, t in measured) / sum(n for n, _ in measured), "estimate"
                how = f"samples x {mean:,.1f} tokens/sample (mean of the tokenized sources)"
            else:
                mean, basis, how = self.tps, "assumed", f"samples x {self.tps:,} tokens/sample"
            mix = {"train_samples": train, "eval_samples": evl,
                   "train_tokens": figures.tokens_of(train, mean, basis, how),
                   "eval_tokens": figures.tokens_of(evl, mean, basis, how)}
        self.mix = mix
        row.figures["samples"] = figures.total([mix["train_samples"], mix["eval_samples"]], "train + eval")
        row.figures["tokens"] = figures.total([mix["train_tokens"], mix["eval_tokens"]], "train + eval")
        row.figures.update(mix)
        fmt = lambda f: f"{f.value:,}" if f.known else "?"  # noqa: E731
        row.other = f"train {fmt(mix['train_samples'])} + eval {fmt(mix['eval_samples'])}"

    def vocab(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        row.figures["samples"], row.figures["tokens"] = self.mix["train_samples"], self.mix["train_tokens"]
        if m is None:
            row.figures["output_bytes"] = figures.vocab_bytes(self.config.model.draft.vocab_size,
                                                               self.config.model.vocab_size)
        row.other = f"d2t+t2d {row.figures['output_bytes'].value:,} B"

    def plan_store(self, m: Optional[Manifest]) -> tuple[Figure, Figure]:
        """The store this config's extraction fills (also planned when online training fills none)."""
        model, ex = self.config.model, self.config.extract
        samples = figures.total([self.mix["train_samples"], self.mix["eval_samples"]], "train + eval")
        tokens = figures.total([self.mix["train_tokens"], self.mix["eval_tokens"]], "train + eval")
        if m:
            samples, tokens = Figure(m.extra["samples"], "actual"), Figure(m.counts["tokens"], "actual")
        configured = ex.storage_format
        fmts = list(dict.fromkeys([*SHOWN_FORMATS, configured]))
        ests = figures.store_estimates(samples, tokens, model.hidden_size, len(model.capture_layers), fmts)
        self.store = {"dir": self.chain.store_dir(), "configured": configured, "formats": fmts, "estimates": ests,
                      "complete": m is not None,
                      "bytes": {fmt: figures.store_bytes(ests[fmt], samples, tokens) for fmt in fmts}}
        return samples, tokens

    def extract(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        model = self.config.model
        samples, tokens = self.plan_store(m)
        row.figures["samples"], row.figures["tokens"] = samples, tokens
        configured, fmts, ests = self.store["configured"], self.store["formats"], self.store["estimates"]
        for fmt in fmts:
            row.figures[f"store_bytes_{fmt}"] = self.store["bytes"][fmt]
        row.inputs["store"] = str(self.store["dir"])
        row.other = " | ".join(f"{fmt}{'*' if fmt == configured else ''} " + (
            _human(ests[fmt].total) if ests[fmt] else "?") for fmt in fmts)
        if not samples.known:  # still say what the store costs per 1K samples, as the dry run does
            per_1k = figures.store_estimates(Figure(1000, "config"), Figure(1000 * self.tps, "assumed"),
                                              model.hidden_size, len(model.capture_layers), fmts)
            for fmt in fmts:
                row.figures[f"store_bytes_{fmt}_per_1k_samples"] = figures.store_bytes(
                    per_1k[fmt], Figure(1000, "config"), Figure(1000 * self.tps, "assumed"))
            row.other += " (per 1K samples: " + ", ".join(
                f"{fmt} {_human(est.total) if est else '?'}" for fmt, est in per_1k.items()) + ")"

    def train(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        tr = self.config.train
        row.figures["samples"], row.figures["tokens"] = self.mix["train_samples"], self.mix["train_tokens"]
        epochs = figures.token_epochs(self.mix["train_tokens"], tr.max_epochs, tr.max_steps)
        row.figures["token_epochs"] = epochs
        row.other = f"token-epochs {epochs.value:,}" if epochs.known else "token-epochs ?"

    def eval(self, row: UnitPlan, m: Optional[Manifest]) -> None:
        ev = self.config.eval
        row.figures["samples"], row.figures["tokens"] = self.mix["eval_samples"], self.mix["eval_tokens"]
        dec = figures.decode_tokens(self.mix["eval_samples"], ev.num_prompts, ev.max_new_tokens, len(ev.ks))
        row.figures["decode_tokens"] = dec
        row.other = f"decode <= {dec.value:,} tokens"


def _human(n: int) -> str:
    from eagle3.artifacts import format_bytes

    return format_bytes(n)


def _model_source(config: Eagle3Config) -> Optional[str]:
    """The config.json `model=auto` read the target's geometry from; None when the config spells it out."""
    if not config.model.geometry_from_checkpoint:
        return None
    m = config.model
    return str(target_config(m.path, m.revision, m.text_config_key, config.paths.hf_cache).file)


def _header(config: Eagle3Config, chain: ChainView, root: Path) -> dict[str, Any]:
    from hydra.core.hydra_config import HydraConfig

    # No Hydra context in library use and tests: no experiment to name.
    experiment = HydraConfig.get().runtime.choices.get("experiment") if HydraConfig.initialized() else None
    m = config.model
    g = config_geometry(m)
    return {"experiment": experiment, "dataset": config.dataset.name, "model": m.name,
            "model_source": _model_source(config), "num_layers": m.num_layers, "vocab_size": m.vocab_size,
            "hidden_size": m.hidden_size, "capture_layers": list(m.capture_layers),
            "draft_vocab_size": g.draft_vocab_size, "fc_in_features": g.fc_in_features,
            "draft": {"attention": g.attention, "num_layers": g.num_layers, "hidden_size": g.hidden_size,
                      "heads": g.num_attention_heads, "kv_heads": g.num_key_value_heads,
                      "intermediate_size": g.intermediate_size, **_mla_geometry(g), **draft_cost(g)},
            "generate_backend": config.generate.backend, "root": str(root),
            "data": {"scale": config.data.scale, "eval_size": config.data.eval_size},
            "sources": {n: {"track": s.track, "num_samples": s.num_samples, "weight": s.weight}
                        for n, s in config.dataset.sources.items()}}


def _mla_geometry(g) -> dict[str, int]:
    return {name: getattr(g, name) for name in MLA_FIELDS} if g.is_mla else {"head_dim": g.head_dim}


def _totals(planner: Planner, rows: dict[str, list[UnitPlan]]) -> dict[str, Figure]:
    """Whole-chain figures from the rows (merge, extract, train and eval have one unit each)."""
    one = lambda stage: rows[stage][0].figures if rows.get(stage) else {}  # noqa: E731
    gens = rows.get("generate", [])
    none = Figure(0, "config", "no prompt-only source: nothing to generate")
    totals = {"samples": one("merge").get("samples"), "tokens": one("merge").get("tokens")}
    totals.update({k: one("merge").get(k) for k in ("train_samples", "eval_samples", "train_tokens", "eval_tokens")})
    for key in ("generated_tokens_one_turn", "generated_tokens_max"):
        totals[key] = figures.total((r.figures[key] for r in gens), "sum over prompt-only sources") if gens else none
    if gens and totals["generated_tokens_one_turn"] is not None and not totals["generated_tokens_one_turn"].known:
        parts = [r.figures.get("generated_tokens_at_share", r.figures["generated_tokens_one_turn"]) for r in gens]
        totals["generated_tokens_at_share"] = figures.total(parts, "per answered turn if each prompt-only source "
                                                                    "supplied only its merge share")
    for key, value in one("extract").items():
        if key.startswith("store_bytes_"):
            totals[key] = value
    totals["token_epochs"] = one("train").get("token_epochs")
    totals["decode_tokens"] = one("eval").get("decode_tokens")
    return {k: v for k, v in totals.items() if v is not None}


def _disk(config: Eagle3Config, planner: Planner) -> dict[str, Any]:
    """The extract preflight's check for each shown format (`eagle3.extract.preflight`)."""
    from eagle3.extract.preflight import free_space

    ex, store = config.extract, planner.store
    free, where = free_space(store["dir"], ex.assume_free_bytes)
    checks = {}
    for fmt in store["formats"]:
        if store["complete"]:
            checks[fmt] = {"fits": True, "line": "the extract unit is complete: its samples are in the store already"}
        else:
            checks[fmt] = figures.disk_check(store["estimates"][fmt], store["dir"], ex.disk_margin_gb,
                                              ex.assume_free_bytes)
    online = config.train.hidden_states == ONLINE
    return {"store_dir": str(store["dir"]), "free_bytes": free, "measured_at": where, "online": online,
            "margin_gb": ex.disk_margin_gb, "configured": store["configured"], "checks": checks}


def _assumptions(config: Eagle3Config, planner: Planner, rows: dict[str, list[UnitPlan]]) -> list[str]:
    """The assumptions behind the figures that are not measured, with the numbers used."""
    from eagle3.draft.geometry import config_refusals
    from eagle3.layer_ids import ENGINES
    from eagle3.states import formats

    m, gen, ex, data = config.model, config.generate, config.extract, config.data
    n_capture, hidden = len(m.capture_layers), m.hidden_size
    bpt = {f: formats.bytes_per_token(f, hidden, n_capture) for f in planner.store["formats"]}
    figures = [f for stage_rows in rows.values() for r in stage_rows for f in r.figures.values()]
    lines = []
    if any(f.basis == "assumed" for f in figures):
        lines.append(f"tokens per sample: {planner.tps:,} (extract.assumed_tokens_per_sample) wherever no tokenize "
                     "or merge manifest measured them; such figures say (assumed)")
    unknown = [r.unit for r in rows.get("prep", []) if not r.figures["samples"].known]
    if unknown:
        lines.append(f"sources with num_samples null take all of the source, whose size this plan does not "
                     f"download to learn: {', '.join(unknown)} (known once prep has run)")
    scale = "everything" if data.scale is None else f"{data.scale:,}"
    if any(r.status != "complete" for r in rows.get("merge", [])):
        lines.append(f"merge: data.scale={scale} train + data.eval_size={data.eval_size:,} eval samples, "
                     "the sources contributing by weight (shares in the prep rows) and holding enough after "
                     "filters and dedupe")
    if any(r.status != "complete" for r in rows.get("generate", [])):
        lines.append(f"generated tokens are upper bounds: generate.max_new_tokens={gen.max_new_tokens:,} per "
                     f"answered user turn, at most generate.max_user_turns={gen.max_user_turns} turns per "
                     "conversation; most prompts have one turn")
    per = ", ".join(f"{f} {b:,} B/token" for f, b in bpt.items())
    lines.append(f"store bytes = tokens x bytes/token + {formats.SAMPLE_OVERHEAD_BYTES:,} B per sample "
                 f"(eagle3.states.formats / preflight, as extract's own preflight): {per} for hidden "
                 f"{hidden:,} x ({n_capture} captured layers + the final state); samples another mix already "
                 "put in the shared, content-keyed store are not subtracted")
    lines.append(f"disk: free space of the store root's filesystem (or extract.assume_free_bytes) minus "
                 f"extract.disk_margin_gb={ex.disk_margin_gb:g}; the configured format is marked *")
    lines.append(f"train token-epochs = train.max_epochs={config.train.max_epochs} x train tokens")
    refused = config_refusals(m)
    if refused:  # validation let the config through, so some engine serves the draft
        lines.append(f"draft export: {', '.join(e for e in ENGINES if e not in refused)} only; "
                     + "; ".join(f"{engine} cannot serve {', '.join(sorted({r.config_key for r in why}))} "
                                 f"({why[0].message()})" for engine, why in refused.items()))
    lines.append("hidden states: store mode runs the target once over train + eval (extract); online mode runs it "
                 "over the train split every epoch and the eval split at each validation "
                 f"(train.eval_every_n_epochs={config.train.eval_every_n_epochs}), at the closing pooled eval "
                 "and in the eval stage. Wall times divide those tokens by tokens/s measured in earlier manifests "
                 "of the same target and draft (actual when measured by this very unit); online with no online "
                 "run measured adds the target forward and the draft step per token (no overlap)")
    return lines


def build_plan(config: Eagle3Config, chain: ChainView, root: Path) -> dict[str, Any]:
    """The plan as plain data (exactly what plan.json holds and what both renderings show).

    Args:
        config: The job's config, which every figure is derived from.
        chain: The stages' view of the same config (units, their directories).
        root: The artifact root (shown in the header).
    """
    from eagle3.planning.modes import hidden_state_modes
    from eagle3.planning.predicted_tau import predicted_tau

    planner = Planner(config, chain)
    rows: dict[str, list[UnitPlan]] = {}
    stages = []
    for name, help_line in chain.stages():
        rows[name] = []
        for unit in chain.units(name):
            row, manifest = locate(chain, name, unit)
            getattr(planner, name)(row, manifest)
            rows[name].append(row)
        stages.append({"stage": name, "help": help_line, "units": [r.to_dict() for r in rows[name]]})
    if not planner.store:  # online training: no extract unit, but the store it avoids is still shown
        planner.plan_store(None)
    train = planner.mix.get("train_samples")
    target = (chain.states_identity().get("target") or {}).get("weights")
    return {"format": FORMAT_VERSION, "header": _header(config, chain, root), "stages": stages,
            "totals": {k: f.to_dict() for k, f in _totals(planner, rows).items()},
            "hidden_states": hidden_state_modes(config, chain, planner.mix, planner.store, root),
            "disk": _disk(config, planner), "assumptions": _assumptions(config, planner, rows),
            "predicted_tau": predicted_tau(root, target, train.value if train is not None else None),
            "basis": dict(figures.BASIS_MEANING)}
