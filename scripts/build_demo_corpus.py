#!/usr/bin/env python
"""Extract the demo corpus (documented stdlib functions) into ``eagle3/assets/demo_corpus.jsonl.gz``.

The demo target and every demo dataset are built from this one committed file rather than the
live standard library, so that a different Python version on another machine cannot change the
training data, the held-out split or the fixtures. Rerun this script only to deliberately refresh
the corpus; the output is byte-reproducible for a given Python build (sorted records, gzip
``mtime=0``, no embedded file name).

Usage:
    python scripts/build_demo_corpus.py [--out eagle3/assets/demo_corpus.jsonl.gz]
"""

from __future__ import annotations

import argparse
import ast
import gzip
import io
import json
import platform
import sysconfig
import textwrap
from pathlib import Path

# Pure-Python modules only (C-accelerated ones such as decimal are thin shims with no source).
# Fixed and sorted: changing it changes the held-out split, so treat it as part of the format.
MODULES = sorted([
    "abc", "argparse", "ast", "asyncio.events", "base64", "bdb", "bisect", "calendar", "cmd",
    "codecs", "collections", "configparser", "contextlib", "copy", "csv", "dataclasses",
    "datetime", "difflib", "dis", "doctest", "email.message", "email.utils", "enum", "filecmp",
    "fileinput", "fnmatch", "fractions", "ftplib", "functools", "getopt", "glob", "gzip", "heapq",
    "hmac", "html", "html.parser", "http.client", "http.cookiejar", "http.cookies", "http.server",
    "imaplib", "importlib.metadata", "inspect", "ipaddress", "json", "json.decoder",
    "json.encoder", "locale", "logging", "logging.handlers", "mailbox", "mimetypes", "ntpath",
    "numbers", "operator", "optparse", "pathlib", "pdb", "pickle", "pkgutil", "platform",
    "plistlib", "poplib", "posixpath", "pprint", "pydoc", "queue", "quopri", "random", "sched",
    "secrets", "selectors", "shlex", "shutil", "smtplib", "socketserver", "ssl", "statistics",
    "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize",
    "trace", "traceback", "typing", "unittest.case", "unittest.mock", "urllib.parse",
    "urllib.request", "uuid", "warnings", "weakref", "xml.etree.ElementTree", "zipapp", "zipfile",
])

MAX_SOURCE_LINES = 25
MAX_DOC_CHARS = 400
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "eagle3" / "assets" / "demo_corpus.jsonl.gz"


def module_file(stdlib: Path, module: str) -> Path:
    """Map a dotted module name to its source file without importing it."""
    base = stdlib.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def first_paragraph(doc: str) -> str:
    """The summary paragraph; later paragraphs are too long and too odd for a tiny model."""
    para = doc.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in para.splitlines())
    if len(text) > MAX_DOC_CHARS:
        text = text[:MAX_DOC_CHARS].rsplit(" ", 1)[0] + " ..."
    return text


def _params(args: ast.arguments, is_method: bool) -> list[str]:
    """Required parameter names, the ones a call example must pass."""
    positional = [a.arg for a in args.posonlyargs + args.args]
    required = positional[: len(positional) - len(args.defaults)]
    if is_method and required and required[0] in ("self", "cls"):
        required = required[1:]
    kwonly = [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    return required + kwonly


def _snippet(lines: list[str], node: ast.stmt) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    assert node.end_lineno is not None  # ast.parse sets it
    end = min(node.end_lineno, start + MAX_SOURCE_LINES)
    body = textwrap.dedent("\n".join(lines[start:end]))
    return "\n".join(line.rstrip() for line in body.splitlines())


def _record(module, rel, lines, node, qualname, kind, is_method):
    doc = ast.get_docstring(node, clean=True)
    if not doc or not first_paragraph(doc):
        return None
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is not None:
            params = _params(init.args, True)
            shown = [a for a in ast.unparse(init.args).split(", ") if a not in ("self", "")]
            signature = f"{node.name}({', '.join(shown)})"
        else:
            params = []
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            signature = f"class {node.name}({bases})" if bases else f"class {node.name}"
    else:
        params = _params(node.args, is_method)
        ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
        signature = f"{node.name}({ast.unparse(node.args)}){ret}"
    return {
        "module": module, "qualname": qualname, "kind": kind, "signature": signature,
        "params": params, "doc": first_paragraph(doc), "source": _snippet(lines, node),
        "path": rel, "lineno": node.lineno,
    }


def extract(stdlib: Path, module: str) -> list[dict]:
    """Public documented top-level functions, classes and their methods of one module."""
    path = module_file(stdlib, module)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    rel = path.relative_to(stdlib).as_posix()
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            out.append(_record(module, rel, lines, node, node.name, "function", False))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            out.append(_record(module, rel, lines, node, node.name, "class", False))
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and not sub.name.startswith("_"):
                    out.append(_record(module, rel, lines, sub, f"{node.name}.{sub.name}", "method", True))
    return [r for r in out if r is not None]


def build(out: Path) -> dict:
    """Write the corpus; the header line records the Python build it was extracted from."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    seen, records = set(), []
    for module in MODULES:
        for rec in extract(stdlib, module):
            key = (rec["module"], rec["qualname"])
            if key not in seen:  # conditional re-definitions (if/else) keep the first
                seen.add(key)
                records.append(rec)
    records.sort(key=lambda r: (r["module"], r["qualname"]))
    header = {"__header__": True, "python": platform.python_version(),
              "implementation": platform.python_implementation(), "modules": MODULES,
              "num_records": len(records), "max_source_lines": MAX_SOURCE_LINES}
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        for rec in [header] + records:
            gz.write((json.dumps(rec, sort_keys=True, ensure_ascii=True) + "\n").encode())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(buf.getvalue())
    return header


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    header = build(args.out)
    print(f"wrote {header['num_records']} records from {len(MODULES)} modules "
          f"(Python {header['python']}) to {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
