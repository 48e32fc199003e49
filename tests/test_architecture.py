"""The layers of docs/architecture.md hold: no import cycle anywhere in attnlab/, each package
imports only from its own layer or the ones below, and every module imports on its own.

The import graph is read from the source (every ``import`` and ``from ... import``, also those
inside functions; ``if TYPE_CHECKING:`` blocks, which never run, are left out)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attnlab"

# bottom to top: a unit may import from its own layer and the layers below it
LAYERS = [
    {"errors", "version"},
    {"hardware", "config", "presets", "placement", "files"},
    {"nn", "tokenizers"},
    {"models"},
    {"interop", "storage", "build", "compression", "cpu"},
    {"data", "generation", "encoding", "sentence_encoder", "viz", "explain", "training",
     "metrics", "serving"},
    {"tasks"},
    {"demo"},
    {"cli"},
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def modules() -> dict[str, Path]:
    """``attnlab.x.y`` -> its file, for every module (packages by their ``__init__``)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node, except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_graph() -> dict[str, set[str]]:
    """Module -> the attnlab modules it imports."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level
                                                       + 1] + ([base] if base else []))
                for alias in node.names:  # a submodule if one is named, else the module
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in known else base)
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def unit(module: str) -> str:
    """The package or top-level module a module belongs to (``attnlab.cli.train`` -> cli)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "attnlab"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for source, targets in import_graph().items():
        graph.setdefault(unit(source), set()).update(unit(t) for t in targets)
    for u, targets in graph.items():
        targets.discard(u)
    assert cycles(graph) == []


def test_each_package_imports_only_its_layer_or_below():
    graph = import_graph()
    assert set(LAYER) | {"attnlab"} == {unit(m) for m in graph}, "a unit is missing a layer"
    wrong = []
    for source, targets in graph.items():
        if unit(source) == "attnlab":  # the package's front door re-exports the public API
            continue
        for target in targets:
            if unit(target) == "attnlab" or LAYER[unit(target)] > LAYER[unit(source)]:
                wrong.append(f"{source} -> {target}")
    assert wrong == []


def test_every_module_imports_on_its_own():
    """Each module imported first, in a fresh set of attnlab modules: an import that only
    works after another module was imported (a hidden cycle or order dependence) fails."""
    script = (
        "import importlib, sys\n"
        f"names = {sorted(m for m in modules() if not m.endswith('__main__'))!r}\n"
        "failed = []\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'attnlab']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as e:\n"
        "        failed.append(f'{name}: {e!r}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]


def test_the_teaching_blocks_hold_no_kernels():
    """nn/ reads like the course: no C++ source, no kernel loader, no call of attnlab's own ops
    and no import of the CPU engine (attnlab/cpu/), which imports nn/ and is applied from
    beside a built model."""
    nn_dir = PACKAGE / "nn"
    assert sorted(p.name for p in nn_dir.iterdir() if p.suffix in (".cpp", ".h", ".cu")) == []
    for path in nn_dir.rglob("*.py"):
        text = path.read_text()
        for marker in ("torch.ops.attnlab", "cpp_extension", "attnlab.cpu"):
            code = [line for line in text.splitlines()
                    if marker in line and not line.lstrip().startswith(("#", ":", "`"))
                    and "`" not in line]
            assert code == [], f"{path.name}: {marker}: {code}"
    graph = import_graph()
    assert [f"{s} -> {t}" for s, targets in graph.items() if unit(s) == "nn"
            for t in targets if unit(t) == "cpu"] == []
    assert any(unit(t) == "nn" for s, targets in graph.items() if unit(s) == "cpu"
               for t in targets), "the engine is built on nn/'s blocks"
    assert sorted(p.name for p in (PACKAGE / "cpu" / "csrc").iterdir()) == [
        "decode_attention.cpp", "float_kernels.cpp", "int_kernels.cpp", "vectors.h"]


def test_tasks_sit_below_the_cli_and_above_training_and_data():
    assert LAYER["tasks"] < LAYER["cli"] and LAYER["tasks"] < LAYER["demo"]
    assert LAYER["tasks"] > max(LAYER["training"], LAYER["data"], LAYER["generation"])
    assert LAYER["cpu"] > LAYER["nn"] and LAYER["cpu"] < LAYER["generation"]


def _units_on_disk() -> list[str]:
    """Every package and top-level module of attnlab/, as a reader names it (``cpu/``,
    ``storage.py``)."""
    return sorted(p.name + "/" if p.is_dir() else p.name for p in PACKAGE.iterdir()
                  if (p.is_dir() and (p / "__init__.py").exists())
                  or (p.suffix == ".py" and p.name != "__init__.py"))


def test_the_documents_list_every_package():
    """docs/architecture.md and the README's layout table name every package and module."""
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):] if "## Layout" in readme else readme
    for unit_name in _units_on_disk():
        named = re.compile(rf"`(attnlab/)?{re.escape(unit_name)}`")
        assert named.search(architecture), f"docs/architecture.md lacks {unit_name}"
        assert named.search(layout), f"README.md's layout lacks {unit_name}"


def test_the_architecture_page_maps_every_command_to_its_module():
    from attnlab.cli import COMMANDS

    architecture = (ROOT / "docs" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| `attnlab ([\w-]+)[^`]*` \| `cli/(\w+)\.py` \|", architecture,
                           flags=re.M))
    assert rows == COMMANDS
