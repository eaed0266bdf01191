"""The package's shape: every module imports on its own, the import graph has no cycle, no two packages
import each other (directly or round a loop), imports go down the floors of docs/design.md, modules stay
small enough to read, and the one-place rules (one lock, one HTTP layer, loggers by class) hold."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3.paths import PROJECT_ROOT
from tests.conftest import HANG_GUARD_S

PACKAGE = PROJECT_ROOT / "eagle3"
DESIGN = PROJECT_ROOT / "docs" / "design.md"
MAX_MODULE_LINES = 450
MAX_STAGE_LINES = 250


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PROJECT_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# eagle3/assets/ holds data shipped with the package, remote code beside a demo target's weights
# included (a copy of eagle3/demo/tokenization_tiktoken.py, tests/integration/test_demo_kimi.py): not package modules.
MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "assets" not in p.relative_to(PACKAGE).parts}


def import_graph() -> dict[str, set[str]]:
    """Module -> the eagle3 modules it imports anywhere in its body (module level or inside functions).

    `from eagle3.x import y` is an edge to `eagle3.x.y` when that is a module, else to `eagle3.x`;
    either also runs the parent packages' `__init__` first, so those are edges too (the package
    a module lives in is left out: Python runs its `__init__` before the module, not because of it).
    """
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in MODULES:  # `import eagle3.x.y.z` of a name: its module
                    target = target.rpartition(".")[0]
                # Importing eagle3.x.y first runs eagle3/x/__init__.py: an edge to every parent package too.
                while target.startswith("eagle3") and target != "eagle3":
                    if target != name and not name.startswith(target + "."):
                        edges.add(target)
                    target = target.rpartition(".")[0]
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path `[a, b, ..., a]`, or [] when there is none."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 80
    assert "eagle3.serving.http" in graph["eagle3.generation.http_backend"]  # module-level edges are seen
    assert "eagle3.generation.hf_backend" not in graph["eagle3.generation.factory"]  # a registry names strings
    assert "eagle3.draft.export" in graph["eagle3.serving.launch_checks"]  # imports inside functions count too
    assert find_cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def import_layers() -> dict[str, tuple[int, str]]:
    """Each part of eagle3 (the package itself, a top-level module or subpackage) -> `(layer, name)`.

    Read from the one table of layers, docs/design.md 'Import layers':
    a row `| 3 | domain | `eagle3.data`, ... | ... |`.
    """
    section = DESIGN.read_text(encoding="utf-8").split("### Import layers", 1)[1].split("\n#", 1)[0]
    layers: dict[str, tuple[int, str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        for part in re.findall(r"`(eagle3(?:\.\w+)?)`", cells[2]):
            assert part not in layers, f"docs/design.md puts {part} in two layers"
            layers[part] = (int(cells[0]), cells[1])
    return layers


def part_of(module: str) -> str:
    """The part of eagle3 a module belongs to in the layer table: `eagle3.config.registration` -> `eagle3.config`."""
    return ".".join(module.split(".")[:2])


def test_every_part_of_the_package_has_one_layer():
    layers = import_layers()
    parts = {part_of(name) for name in MODULES}
    assert sorted(parts - set(layers)) == [], "add these to the table in docs/design.md, 'Import layers'"
    assert sorted(set(layers) - parts) == [], "the table in docs/design.md names parts that do not exist"
    rank = {part: layer for part, (layer, _) in layers.items()}
    assert rank["eagle3.errors"] < rank["eagle3.config"] < rank["eagle3.serving"] < rank["eagle3.stages"] \
        < rank["eagle3.cli"]


def upward_imports(graph: dict[str, set[str]], layers: dict[str, tuple[int, str]]) -> list[str]:
    """Every import of a module from a part on a higher floor, as one readable line each."""
    return [f"{name} ({layers[part_of(name)][1]}) imports {target} ({layers[part_of(target)][1]})"
            for name, targets in sorted(graph.items()) for target in sorted(targets)
            if layers[part_of(target)][0] > layers[part_of(name)][0]]


def part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph seen between parts (`eagle3.draft`, `eagle3.errors`, ...): a loop here is two
    packages that need each other, even where no single module cycle shows it."""
    parts: dict[str, set[str]] = {}
    for name, targets in graph.items():
        edges = parts.setdefault(part_of(name), set())
        edges.update(part_of(t) for t in targets if part_of(t) != part_of(name))
    for edges in list(parts.values()):
        for target in edges:
            parts.setdefault(target, set())
    return parts


def test_imports_go_down_the_layers():
    """No module imports a part of a higher floor (imports inside functions count: they run too)."""
    upward = upward_imports(import_graph(), import_layers())
    assert upward == [], "\n".join(upward)


def test_no_two_packages_import_each_other():
    loop = find_cycle(part_graph(import_graph()))
    assert loop == [], " -> ".join(loop)


def test_the_floor_checks_catch_an_upward_import_and_a_package_loop():
    """The two checks above on a made-up package: they can fail."""
    layers = {"eagle3.draft": (6, "draft"), "eagle3.states": (5, "states"), "eagle3.tracking": (7, "reports")}
    graph = {"eagle3.draft.fit": {"eagle3.tracking", "eagle3.states.dataset"},
             "eagle3.states.dataset": {"eagle3.draft.geometry"}, "eagle3.draft.geometry": set(),
             "eagle3.tracking": set()}
    assert upward_imports(graph, layers) == [
        "eagle3.draft.fit (draft) imports eagle3.tracking (reports)",
        "eagle3.states.dataset (states) imports eagle3.draft.geometry (draft)"]
    assert find_cycle(part_graph(graph)) == ["eagle3.draft", "eagle3.states", "eagle3.draft"]
    del graph["eagle3.states.dataset"]
    assert find_cycle(part_graph(graph)) == []


def test_config_imports_no_domain_package():
    """eagle3.config reads leaves, hydra and omegaconf only: domain rules are handed to it (eagle3.stages)."""
    layers = import_layers()
    below = {part for part, (layer, _) in layers.items() if layer < layers["eagle3.config"][0]}
    graph = import_graph()
    config = sorted(name for name in graph if part_of(name) == "eagle3.config")
    assert len(config) >= 5
    assert [f"{name} -> {target}" for name in config for target in sorted(graph[name])
            if part_of(target) not in below | {"eagle3.config"}] == []
    third_party = set()
    for name in config:
        for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                third_party.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                third_party.add(node.module.split(".")[0])
    assert sorted(third_party - set(sys.stdlib_module_names) - {"__future__", "eagle3"}) == ["hydra", "omegaconf"]


#: Third-party packages loaded once before the forks (they are 4-5 s of each fresh interpreter's
#: 5-6 s): what the test guards is eagle3's own import order, and no eagle3 module is loaded before
#: a fork. The price: an eagle3 module that used a submodule of one of these without importing it
#: would pass here, which a fresh interpreter per module (86 s of CI) would have caught.
PRELOADED = ("torch", "numpy", "transformers", "lightning", "hydra", "omegaconf", "safetensors")

# Reads module names on stdin; imports each in a forked child (two at a time); prints
# `module<TAB>exit code<TAB>last line of its error`.
_FORK_IMPORTER = """
import os, sys, traceback
for package in sys.argv[1:]:
    __import__(package)
assert not any(m == "eagle3" or m.startswith("eagle3.") for m in sys.modules)
names, running, results = sys.stdin.read().split(), {}, []
def reap():
    pid, status = os.wait()
    name, reader = running.pop(pid)
    with os.fdopen(reader) as pipe:
        error = pipe.read().strip().splitlines()
    results.append((name, os.waitstatus_to_exitcode(status), error[-1] if error else ""))
for name in names:
    if len(running) == 2:
        reap()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        code = 0
        try:
            __import__(name)
        except BaseException:
            os.write(writer, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(writer)
    running[pid] = (name, reader)
while running:
    reap()
for name, code, error in results:
    print(name, code, error, sep="\t")
"""


@pytest.mark.slow
def test_every_module_imports_on_its_own_in_a_fresh_interpreter():
    done = subprocess.run([sys.executable, "-c", _FORK_IMPORTER, *PRELOADED], input="\n".join(MODULES),
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line.split("\t") for line in done.stdout.splitlines()]
    failed = [f"{module}: {error}" for module, code, error in results if code != "0"]
    assert not failed, "\n".join(failed)
    assert sorted(module for module, _, _ in results) == sorted(MODULES) and len(MODULES) > 80


def test_modules_stay_readable_and_stage_modules_stay_wiring():
    too_long = []
    for name, path in MODULES.items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        limit = MAX_STAGE_LINES if name.startswith("eagle3.stages.") else MAX_MODULE_LINES
        if lines > limit:
            too_long.append(f"{path.relative_to(PROJECT_ROOT)}: {lines} lines > {limit}")
    assert not too_long


#: Module names that may repeat, each a convention rather than a clash: a package's `__init__`, each
#: package's `rules` (the validation rules it registers), and a stage module named for its stage
#: (`eagle3.stages.eval` wires stage eval; the domain modules it calls are named for what they do).
SHARED_MODULE_NAMES = {"__init__", "rules"}


def test_module_names_are_unique_outside_the_stage_registry():
    """`bench.py` in four packages made every traceback and import a riddle: a name says which module it is."""
    by_name: dict[str, list[str]] = {}
    for name in MODULES:
        if not name.startswith("eagle3.stages."):
            by_name.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    clashes = {base: names for base, names in by_name.items() if len(names) > 1 and base not in SHARED_MODULE_NAMES}
    assert clashes == {}
    stage_modules = {name.rsplit(".", 1)[-1] for name in MODULES if name.startswith("eagle3.stages.")}
    assert {"bench", "eval", "plan"} <= stage_modules  # the exemption is used, so the check above is not vacuous
    assert len(by_name["rules"]) >= 5


@pytest.mark.parametrize("pattern,why", [
    (r"\bfcntl\b", "locks are eagle3.artifacts.locks (filelock)"),
    (r"\burllib\.request\b|^\s*import urllib\b|\bhttp\.client\b", "HTTP is eagle3.serving.http (aiohttp)"),
    (r"__name__\s*==\s*[\"']\w*Logger|endswith\([\"']\w*Logger", "loggers are told apart with isinstance "
                                                                  "(eagle3.reports.loggers)"),
])
def test_one_implementation_of_each_thing(pattern, why):
    hits = [f"{path.relative_to(PROJECT_ROOT)}:{i}" for path in MODULES.values()
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if re.search(pattern, line)]
    assert not hits, f"{why}: {hits}"


#: Where a `DictConfig` may appear in a signature: the Hydra side (the entrypoint and its sweep
#: callback, composition and validation).
DICTCONFIG_ALLOWED = ("eagle3.cli", "eagle3.config")
OMEGACONF_TYPES = re.compile(r"\b(DictConfig|ListConfig|OmegaConf)\b")


def _signature_annotations(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = fn.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
    return [ast.unparse(a.annotation) for a in every if a.annotation is not None] + \
        ([ast.unparse(fn.returns)] if fn.returns is not None else [])


def test_domain_code_takes_the_schema_dataclasses_not_a_dictconfig():
    """Outside the Hydra side, functions take the dataclasses of eagle3.config.schema (a misspelt key
    is a type error), so no signature names an OmegaConf type."""
    found = []
    for name, path in MODULES.items():
        if name.startswith(DICTCONFIG_ALLOWED):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            bad = [a for a in _signature_annotations(fn) if OMEGACONF_TYPES.search(a)]
            if bad:
                found.append(f"{path.relative_to(PROJECT_ROOT)}:{fn.lineno} {fn.name}({', '.join(bad)})")
    assert found == [], "\n".join(found)


def test_the_signature_check_sees_a_dictconfig_parameter():
    fn = ast.parse("def f(cfg: 'DictConfig', n: int) -> Optional[ListConfig]: ...").body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert [a for a in _signature_annotations(fn) if OMEGACONF_TYPES.search(a)] == ["'DictConfig'", "Optional[ListConfig]"]


#: The exceptions of eagle3 that do not derive from Eagle3Error, and why none of them reaches the
#: entrypoint's one handler as itself. Every other one carries its exit code (`Eagle3Error.exit_code`)
#: and is printed as one line by `eagle3.cli`; a new exception class lands in one list or the other.
NOT_USER_FACING = {
    # One record's problem: the record is quarantined with the reason, the job goes on.
    "eagle3.data.adapters.AdapterError": "record",
    "eagle3.data.conversation.ConversationError": "record",
    "eagle3.data.glaive.GlaiveFormatError": "record",
    "eagle3.data.render.Reject": "record",
    "eagle3.data.special_text.SpecialTextError": "record",
    "eagle3.generation.openai_chat.BadResponse": "record (one reply; retried, then the record is rejected)",
    # Caught where raised and turned into a config error or an Eagle3Error naming the server.
    "eagle3.config.registration.DerivedValueError": "config rule",
    "eagle3.serving.http.HTTPFailure": "transport (callers name the server and the stage)",
    "eagle3.extract.server_states.RetryRequest": "transport (retried, then a reject or ServerDown)",
    "eagle3.extract.server_states.RefusedPrompt": "record (the prompt is rejected with the reason)",
    "eagle3.generation.http_backend._Failure": "private",
    "eagle3.serving.watchdog._Terminated": "private",
    # A full disk: an OSError(ENOSPC), which the handler recognises as one (eagle3.errors.no_space_cause).
    "eagle3.states.writer.DiskFull": "full disk",
    # Our bug, not the user's: the traceback is what to report.
    "eagle3.artifacts.manifest.CountsMismatch": "bug",
    "eagle3.draft.evaluate.LossyDecoding": "bug",
}


def test_every_user_facing_exception_carries_its_exit_code():
    import importlib
    import inspect

    from eagle3.errors import Eagle3Error

    outside = set()
    for name in MODULES:
        module = importlib.import_module(name)
        outside |= {f"{name}.{cls.__name__}" for cls in vars(module).values()
                    if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == name
                    and not issubclass(cls, Eagle3Error)}
    assert sorted(outside) == sorted(NOT_USER_FACING)


TESTS = PROJECT_ROOT / "tests"
#: The test tiers beside `unit/` (docs/testing.md, "Layout").
TEST_TIERS = {"unit", "integration", "repo"}


def test_the_tests_mirror_the_package():
    """Every test file sits in a tier; under `tests/unit/` each folder is a package of eagle3 (and a
    file at its top tests one of eagle3's top-level modules), so a reader finds a package's tests by its name."""
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    top_modules = {p.stem for p in PACKAGE.glob("*.py")}
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        parts = path.relative_to(TESTS).parts
        if parts[0] not in TEST_TIERS:
            misplaced.append(f"{path.relative_to(TESTS)}: not in a tier ({', '.join(sorted(TEST_TIERS))})")
        elif parts[0] == "unit" and len(parts) == 2 and path.stem.removeprefix("test_") not in top_modules:
            misplaced.append(f"{path.relative_to(TESTS)}: tests/unit/ holds eagle3's top-level modules' tests only")
        elif parts[0] == "unit" and len(parts) > 2 and parts[1] not in packages:
            misplaced.append(f"{path.relative_to(TESTS)}: tests/unit/{parts[1]}/ names no package of eagle3")
    assert misplaced == []
