"""Text and markdown renderings of `stage=plan`'s data (`eagle3.planning.chain.build_plan`).

Both render the plain data that goes to plan.json, never the live objects, so what is printed,
what plan.md says and what plan.json holds cannot drift apart.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import format_bytes

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
    return (f"eagle3 plan: {exp}dataset={h['dataset']} ({len(tracks)} sources: {mix}), model={h['model']} "
            f"(hidden {h['hidden_size']:,}, capture {h['capture_layers']}), generate backend "
            f"{h['server_backend']}")


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


def render_text(data: dict[str, Any]) -> str:
    """The fixed-width plan printed on stdout."""
    h, root = data["header"], data["header"]["root"]
    lines = [_title(h), f"artifact root {root} (unit paths below are relative to it); nothing was run, "
                        "loaded or downloaded", ""]
    table = [(s["stage"], u) for s in data["stages"] for u in s["units"]]
    widths = [max([len(c)] + [len(_cells(s, u)[i]) for s, u in table]) for i, c in enumerate(COLUMNS)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
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
    disk = data["disk"]
    lines += ["", f"DISK CHECK (the extract preflight; store {disk['store_dir']})",
              f"  free {format_bytes(disk['free_bytes'])} ({disk['free_bytes']:,} B) at {disk['measured_at']}, "
              f"margin extract.disk_margin_gb={disk['margin_gb']:g}"]
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
    lines = [f"# {_title(h)}", "", f"Artifact root `{root}`; unit paths are relative to it. Nothing was run.", "",
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
    disk = data["disk"]
    lines += ["", "## Disk check (extract preflight)", "",
              f"Store `{disk['store_dir']}`; free {format_bytes(disk['free_bytes'])} ({disk['free_bytes']:,} B) at "
              f"`{disk['measured_at']}`, margin {disk['margin_gb']:g} GB.", ""]
    for fmt_name, check in disk["checks"].items():
        star = " (configured)" if fmt_name == disk["configured"] else ""
        lines.append(f"- **{fmt_name}**{star}: {check['line']}")
    lines += ["", "## Assumptions", ""] + [f"- {a}" for a in data["assumptions"]]
    lines += ["", "## Basis of each figure", ""] + [f"- ({k}) {v}" for k, v in data["basis"].items()]
    return "\n".join(lines) + "\n"
