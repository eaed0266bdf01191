"""Text and markdown renderings of `stage=plan`'s data (`eagle3.planning.chain.build_plan`).

Both render the plain data that goes to plan.json, never the live objects, so what is printed,
what plan.md says and what plan.json holds cannot drift apart.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import format_bytes, format_duration

WIDTH = 118
COLUMNS = ("STAGE", "UNIT", "STATUS", "SAMPLES", "TOKENS", "OTHER")
TOTALS = (
    ("samples", "samples in the mix (train + eval)"),
    ("train_samples", "  of which train"),
    ("tokens", "tokens in the mix"),
    ("train_tokens", "  of which train"),
    ("generated_tokens_one_turn", "generated tokens, per answered turn"),
    ("generated_tokens_max", "generated tokens, ceiling (all turns)"),
    ("generated_tokens_at_share", "generated tokens at merge shares, per turn"),
    ("token_epochs", "train token-epochs"),
    ("decode_tokens", "eval decode tokens"),
)


def fig_text(fig: Optional[dict]) -> str:
    """`161,600,000 (assumed)`, `unknown`, or `-` where a figure does not apply."""
    if not fig:
        return "-"
    return "unknown" if fig["value"] is None else f"{fig['value']:,} ({fig['basis']})"


def bytes_text(fig: dict) -> str:
    """`9.3 TB = 9,267,...,... B (assumed)`: readable and exact."""
    if fig["value"] is None:
        return "unknown"
    return f"{format_bytes(fig['value'])} = {fig['value']:,} B ({fig['basis']})"


def relative(path: Optional[str], root: str) -> str:
    """A path under the artifact root, relative to it (the root is printed once)."""
    if path is None:
        return "-"
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def _title(h: dict) -> str:
    exp = f"experiment={h['experiment']}, " if h.get("experiment") else ""
    tracks = [s["track"] for s in h["sources"].values()]
    mix = ", ".join(f"{tracks.count(t)} {t}" for t in sorted(set(tracks)))
    return (f"eagle3 plan: {exp}dataset={h['dataset']} ({len(tracks)} sources: {mix}), model={h['model']}, "
            f"generate.backend={h['generate_backend']}")


def model_line(h: dict) -> str:
    """`model: NAME (auto from FILE): 8 layers, hidden 64, ...`: the target and draft geometry the chain uses."""
    source = f" (auto from {h['model_source']})" if h.get("model_source") else ""
    return (f"model: {h['model']}{source}: {h['num_layers']} layers, hidden {h['hidden_size']}, vocab "
            f"{h['vocab_size']}, capture {h['capture_layers']}, draft vocab {h['draft_vocab_size']}, "
            f"fc {h['fc_in_features']}")


def draft_line(h: dict) -> str:
    """`draft: mla attention (kv_lora_rank 512, ...), 1 layer, 0.90 B parameters, 1.48 GFLOP per drafted token ...`."""
    d = h["draft"]
    shape = ", ".join(f"{k} {v}" for k, v in d.items() if k.endswith(("_rank", "_dim")))
    layers = f"{d['num_layers']} layer{'s' if d['num_layers'] != 1 else ''}"
    return (f"draft: {d['attention']} attention ({shape}, {d['heads']} heads, {d['kv_heads']} kv heads), {layers}, "
            f"hidden {d['hidden_size']}, MLP {d['intermediate_size']}; {d['trainable_parameters'] / 1e9:.3f} B "
            f"trainable parameters; {d['step_flops'] / 1e9:.3f} GFLOP per drafted token (layers + lm_head) + "
            f"{d['fc_flops'] / 1e9:.3f} GFLOP fc per verified token + {d['attention_flops_per_context_token']:,} "
            "FLOP per context token of attention"
            + (f" ({d['absorbed_attention_flops_per_context_token']:,} absorbed, as engines decode MLA)"
               if d["attention"] == "mla" else ""))


def _output(unit: dict, root: str) -> str:
    if unit["after"]:
        of = f" of {unit['after_unit']}" if unit.get("after_unit") else ""
        return f"after {unit['after']} (needs the {unit['after']} output{of} first: its directory depends on it)"
    return relative(unit["output"], root)


def _cells(stage: str, unit: dict) -> list[str]:
    f = unit["figures"]
    return [stage, unit["unit"], unit["status"], fig_text(f.get("samples")), fig_text(f.get("tokens")),
            unit.get("other", "")]


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def _totals_lines(data: dict) -> list[tuple[str, str]]:
    totals, configured = data["totals"], data["disk"]["configured"]
    out = [(label, fig_text(totals[key])) for key, label in TOTALS if key in totals]
    for key, fig in totals.items():
        if key.startswith("store_bytes_"):
            fmt = key[len("store_bytes_"):].replace("_per_1k_samples", "")
            what = "hidden-state store" + (" per 1K samples" if key.endswith("_per_1k_samples") else "")
            out.append((f"{what}, {fmt}{' *' if fmt == configured else ''}", bytes_text(fig)))
    return out


ONLINE_DISK = "train.hidden_states=online stores nothing: these checks are what store mode would need"
MODE_ROWS = (
    ("bytes_stored", "hidden-state bytes stored", "bytes"),
    ("target_forward_samples", "target forward passes (samples)", "count"),
    ("target_forward_tokens", "target forward tokens", "count"),
    ("extract_tokens_per_s", "extract tokens/s", "count"),
    ("train_tokens_per_s", "train tokens/s", "count"),
    ("wall_s.extract", "wall: extract", "seconds"),
    ("wall_s.train", "wall: train", "seconds"),
    ("wall_s.total", "wall: extract + train", "seconds"),
)


def _mode_cell(mode: dict, key: str, kind: str) -> str:
    fig: Any = mode
    for part in key.split("."):
        fig = fig.get(part) if isinstance(fig, dict) else None
    if not fig or not isinstance(fig, dict) or "basis" not in fig:
        return "-"
    if fig["value"] is None:
        return "unknown"
    text = {"bytes": lambda v: f"{format_bytes(v)} = {v:,} B" if v else "0 B", "count": lambda v: f"{v:,}",
            "seconds": format_duration}[kind](fig["value"])
    return f"{text} ({fig['basis']})"


def mode_rows(section: dict) -> tuple[list[str], list[list[str]]]:
    """(column heads, rows) of the store-versus-online table; the configured mode is marked *."""
    names = list(section["modes"])
    heads = [f"{n}{'*' if n == section['configured'] else ''}" for n in names]
    rows = [[label] + [_mode_cell(section["modes"][n], key, kind) for n in names] for key, label, kind in MODE_ROWS]
    return heads, [r for r in rows if any(c != "-" for c in r[1:])]


def _mode_title(section: dict) -> str:
    ratio = section.get("online_forward_ratio")
    return (f"HIDDEN STATES: store vs online vs hybrid (train.hidden_states; * = configured; extract.backend="
            f"{section['backend']}; store in {section['storage_format']})"
            + (f"; online runs the target over {ratio:g}x the tokens store mode does" if ratio else ""))


def prediction_lines(prediction: Optional[dict[str, Any]]) -> list[str]:
    """The accept length the training set should reach, from an earlier sweep's data-scale curve."""
    if not prediction:
        return []
    n = prediction["train_samples"]
    head = (f"at {n:,.0f} training samples, from the data-scale curve of {prediction['sweep']} (same target, "
            f"fitted up to {prediction['largest_fitted']:,.0f} samples")
    factor = prediction.get("extrapolation")
    head += f"; {factor:,.0f}x beyond it: an extrapolation)" if factor and factor > 1.5 else ")"
    lines = [head]
    for name, value in sorted(prediction["series"].items(), key=lambda kv: (kv[0] != "sim", kv[0])):
        label = "simulated τ" if name == "sim" else f"real τ at K={name}"
        band = value.get("band")
        lines.append(f"{label}: {value['tau']:.3f}" + (f" (80 %: {band[0]:.3f}-{band[1]:.3f})" if band else "")
                     + f"; the curve's ceiling τ_∞ {value['tau_inf']:.3f}")
    return lines


def render_text(data: dict[str, Any]) -> str:
    """The fixed-width plan printed on stdout."""
    h, root = data["header"], data["header"]["root"]
    lines = [_title(h), model_line(h), draft_line(h),
             f"artifact root {root} (unit paths below are relative to it); nothing was run, loaded or downloaded", ""]
    table = [(s["stage"], u) for s in data["stages"] for u in s["units"]]
    widths = [max([len(c)] + [len(_cells(s, u)[i]) for s, u in table]) for i, c in enumerate(COLUMNS)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip()  # noqa: E731
    lines += [fmt(COLUMNS), fmt(["-" * w for w in widths])]
    for stage in data["stages"]:
        if not stage["units"]:
            lines.append(fmt([stage["stage"], "(no units: nothing of this config needs it)"]))
        for unit in stage["units"]:
            lines.append(fmt(_cells(stage["stage"], unit)))
            for name, path in unit["inputs"].items():
                lines.append(f"    in  {name}: {relative(path, root)}")
            lines.append(f"    out {_output(unit, root)}")
            lines += [x for note in unit["notes"] if not unit["after"] for x in _wrap(f"note: {note}", "    ")]
    lines += ["", "TOTALS"]
    pairs = _totals_lines(data)
    width = max(len(label) for label, _ in pairs)
    lines += [f"  {label.ljust(width)}  {value}" for label, value in pairs]
    if data.get("hidden_states"):
        heads, rows = mode_rows(data["hidden_states"])
        widths = [max(len(r[i]) for r in rows + [[""] + heads]) for i in range(len(heads) + 1)]
        lines += ["", *_wrap(_mode_title(data["hidden_states"]), ""),
                  "  " + "  ".join(c.ljust(w) for c, w in zip([""] + heads, widths, strict=True)).rstrip()]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    predicted = prediction_lines(data.get("predicted_tau"))
    if predicted:
        lines += ["", "PREDICTED ACCEPT LENGTH"] + [x for line in predicted for x in _wrap(line, "  ")]
    disk = data["disk"]
    lines += ["", f"DISK CHECK (the extract preflight; store {disk['store_dir']})",
              f"  free {format_bytes(disk['free_bytes'])} ({disk['free_bytes']:,} B) at {disk['measured_at']}, "
              f"margin extract.disk_margin_gb={disk['margin_gb']:g}"]
    if disk.get("online"):
        lines.append(f"  {ONLINE_DISK}")
    for fmt_name, check in disk["checks"].items():
        verdict = {True: "fits", False: "does NOT fit", None: "cannot check"}[check["fits"]]
        star = "*" if fmt_name == disk["configured"] else ""
        lines.append(f"  {fmt_name}{star}: {verdict}")
        lines += _wrap(check["line"], "      ")
    lines += ["", "ASSUMPTIONS"] + [x for a in data["assumptions"] for x in _wrap(f"- {a}", "  ")]
    lines += ["", "BASIS of each figure"] + [x for k, v in data["basis"].items() for x in _wrap(f"({k}) {v}", "  ")]
    if data.get("files"):
        lines += ["", f"written: {data['files']['json']}, {data['files']['markdown']}"]
    return "\n".join(lines)


def render_markdown(data: dict[str, Any]) -> str:
    """plan.md: the same content as a markdown table and lists."""
    h, root = data["header"], data["header"]["root"]
    lines = [f"# {_title(h)}", "", model_line(h), "", draft_line(h), "",
             f"Artifact root `{root}`; unit paths are relative to it. Nothing was run.", "",
             "| stage | unit | status | samples | tokens | other | inputs | output |",
             "|---|---|---|---|---|---|---|---|"]
    for stage in data["stages"]:
        if not stage["units"]:
            lines.append(f"| {stage['stage']} | (no units) | | | | | | |")
        for unit in stage["units"]:
            inputs = "<br>".join(f"{k}: `{relative(v, root)}`" for k, v in unit["inputs"].items()) or "-"
            cells = _cells(stage["stage"], unit) + [inputs, f"`{_output(unit, root)}`"]
            lines.append("| " + " | ".join(c.replace("|", "\\|") or "-" for c in cells) + " |")
    lines += ["", "## Totals", ""] + [f"- {label.strip()}: {value}" for label, value in _totals_lines(data)]
    if data.get("hidden_states"):
        heads, rows = mode_rows(data["hidden_states"])
        title = _mode_title(data["hidden_states"]).replace("HIDDEN STATES: ", "Hidden states: ")
        lines += ["", f"## {title}", "", "| | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    predicted = prediction_lines(data.get("predicted_tau"))
    if predicted:
        lines += ["", "## Predicted accept length", "", predicted[0] + ":", ""] + [f"- {x}" for x in predicted[1:]]
    disk = data["disk"]
    lines += ["", "## Disk check (extract preflight)", "",
              f"Store `{disk['store_dir']}`; free {format_bytes(disk['free_bytes'])} ({disk['free_bytes']:,} B) at "
              f"`{disk['measured_at']}`, margin {disk['margin_gb']:g} GB.", ""]
    if disk.get("online"):
        lines += [ONLINE_DISK, ""]
    for fmt_name, check in disk["checks"].items():
        star = " (configured)" if fmt_name == disk["configured"] else ""
        lines.append(f"- **{fmt_name}**{star}: {check['line']}")
    lines += ["", "## Assumptions", ""] + [f"- {a}" for a in data["assumptions"]]
    lines += ["", "## Basis of each figure", ""] + [f"- ({k}) {v}" for k, v in data["basis"].items()]
    return "\n".join(lines) + "\n"
