"""The tree's structure: no import cycle among the project's modules (function-local imports
included: a cycle held together by imports inside functions is still a cycle; imports under
``if TYPE_CHECKING:`` are annotations only and do not count), and no op
package importing a private name (``_x``) from another package. Every package under ``ops/``
and ``integrations/`` is listed in ``pyproject.toml``. The ops and the fusion layer allocate
what kernels write only through ``hexlayout.runtime.alloc`` (NaN-filled on the CPU)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: source folder -> the module name it installs as
SOURCES = {ROOT / "hexlayout": "hexlayout", ROOT / "ops": "hexlayout.ops",
           ROOT / "integrations": "hexlayout.integrations"}
SKIP = {"tests"}          # integrations/tests: test modules, not part of the installed tree


def _modules() -> dict[str, pathlib.Path]:
    out: dict[str, pathlib.Path] = {}
    for src, name in SOURCES.items():
        for f in sorted(src.rglob("*.py")):
            rel = f.relative_to(src).with_suffix("").parts
            if SKIP & set(rel) or (src == ROOT / "hexlayout" and rel[:1] in (("ops",), ("integrations",))):
                continue
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            out[".".join((name, *parts))] = f
    return out


def _package(mod: str, path: pathlib.Path) -> str:
    return mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]


def _type_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` block."""
    blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    return {id(n) for top in blocks for n in ast.walk(top)}


def _imports(mod: str, path: pathlib.Path,
             known: dict[str, pathlib.Path]) -> list[tuple[str, list[str], int]]:
    """``(module imported, names taken from it, line)`` for every import in the file at any depth
    (``if TYPE_CHECKING:`` blocks left out)."""
    out = []
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(mod, path).split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            subs = [n for n in names if f"{target}.{n}" in known]
            out += [(f"{target}.{n}", [], node.lineno) for n in subs]
            rest = [n for n in names if n not in subs]
            if rest or not subs:
                out.append((target, rest, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {m: {t for t, _, _ in _imports(m, p, known) if t in known and t != m} for m, p in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_init_of(pkg: str, mod: str) -> bool:
    return mod.startswith(pkg + ".")


def test_no_import_cycle() -> None:
    graph = _graph()
    # a module importing its own package's __init__ (which re-exports the package's modules)
    # is not a cycle with them
    pruned = {m: {t for t in ts if not _is_init_of(t, m)} for m, ts in graph.items()}
    cycles = _cycles(pruned)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _op_package(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[2] if parts[:2] == ["hexlayout", "ops"] and len(parts) > 2 else None


def test_no_private_name_crosses_op_packages() -> None:
    known = _modules()
    bad = []
    for m, p in known.items():
        pkg = _op_package(m)
        if pkg is None:
            continue
        for target, names, line in _imports(m, p, known):
            other = _op_package(target)
            private = [n for n in names if n.startswith("_")] or \
                ([target] if any(s.startswith("_") for s in target.split(".")[3:]) else [])
            if other and other != pkg and private:
                bad.append(f"{p.relative_to(ROOT)}:{line} takes {private} from {target}")
    assert not bad, "private names imported across op packages:\n" + "\n".join(bad)


def test_every_op_and_integration_package_is_listed_in_pyproject() -> None:
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {m for m, p in _modules().items() if p.name == "__init__.py"}
    missing = sorted(found - listed)
    assert not missing, f"packages missing from pyproject.toml [tool.setuptools] packages: {missing}"


def test_quick_tier_covers_every_test_package() -> None:
    """``pytest -m quick`` (tests/conftest.py ``QUICK``) names existing modules, and at least one
    in every test package (each layer's essentials run in the quick tier)."""
    from tests.conftest import QUICK

    missing = [q for q in QUICK if not (ROOT / q).is_file()]
    assert not missing, f"QUICK names modules that do not exist: {missing}"
    packages = {p.parent.name for p in (ROOT / "tests").glob("*/test_*.py")}
    covered = {pathlib.Path(q).parent.name for q in QUICK}
    assert packages <= covered, f"test packages with no quick module: {sorted(packages - covered)}"


#: tensor constructors whose result a kernel would write (``torch.<name>`` or ``t.<name>``)
_ALLOCATORS = {"empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like",
               "empty_strided", "new_empty", "new_zeros", "new_ones", "new_full"}


def test_ops_allocate_outputs_through_runtime_alloc() -> None:
    """No module of ``ops/`` or ``hexlayout/fusion/`` constructs a tensor with torch's own
    allocators (``torch.empty`` / ``zeros`` / ..., ``t.new_empty`` / ...) except on the meta
    device or in a fake implementation (a function named ``*_fake``): outputs and workspaces come from
    ``hexlayout.runtime.alloc.fresh`` (poison-filled on the CPU, so an element a kernel leaves
    unwritten shows in the emulator's tests) or ``zeroed`` (zeros on every device, by contract)."""
    bad = []
    files = [*sorted((ROOT / "ops").rglob("*.py")), *sorted((ROOT / "hexlayout" / "fusion").rglob("*.py"))]
    for f in files:
        tree = ast.parse(f.read_text(), filename=str(f))
        fakes = {id(n) for fn in ast.walk(tree)
                 if isinstance(fn, ast.FunctionDef) and fn.name.endswith("_fake") for n in ast.walk(fn)}
        for n in ast.walk(tree):
            call = isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            if not (call and n.func.attr in _ALLOCATORS):
                continue
            base = ast.unparse(n.func.value)
            if not (base == "torch" or n.func.attr.startswith("new_")) or id(n) in fakes:
                continue
            if any(k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "meta"
                   for k in n.keywords):
                continue
            bad.append(f"{f.relative_to(ROOT)}:{n.lineno}: {ast.unparse(n)[:80]}")
    assert not bad, ("allocate with hexlayout.runtime.alloc.fresh / zeroed (ops: host.launch):\n"
                     + "\n".join(bad))


#: the most lines a function may have outside kernel bodies (``@hl.kernel`` functions, whose
#: length is the kernel's dataflow, and the kernel factories' lines around them are counted)
MAX_FUNCTION_LINES = 100
#: left out: none
LONG_FUNCTION_EXCEPTIONS: set[str] = set()
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _is_kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("kernel" in ast.unparse(d) for d in fn.decorator_list)


def _long_functions(path: pathlib.Path) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function in ``path`` longer than ``MAX_FUNCTION_LINES``,
    not counting the ``@...kernel`` functions it holds (nor any function inside a kernel)."""
    out: list[tuple[str, int]] = []

    def kernel_lines(fn: ast.AST) -> int:
        kernels = [k for k in ast.walk(fn) if k is not fn and isinstance(k, FUNCTIONS) and _is_kernel(k)]
        return sum(k.end_lineno - min([k.lineno] + [d.lineno for d in k.decorator_list]) + 1 for k in kernels)

    def visit(node: ast.AST, prefix: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, FUNCTIONS):
                if _is_kernel(ch):
                    continue
                n = ch.end_lineno - ch.lineno + 1 - kernel_lines(ch)
                if n > MAX_FUNCTION_LINES:
                    out.append((prefix + ch.name, n))
                visit(ch, prefix + ch.name + ".")
            else:
                visit(ch, prefix + ch.name + "." if isinstance(ch, ast.ClassDef) else prefix)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return out


def test_no_function_over_100_lines_outside_kernel_bodies() -> None:
    """Every function of hexlayout/, ops/ and integrations/ (but the exceptions above) is at most
    ``MAX_FUNCTION_LINES`` long, kernel bodies not counted: a longer one is split into named steps."""
    long = []
    for f in _modules().values():
        rel = f.relative_to(ROOT).as_posix()
        if any(rel == e or rel.startswith(e + "/") for e in LONG_FUNCTION_EXCEPTIONS):
            continue
        long += [f"{rel}: {name} ({n} lines)" for name, n in _long_functions(f)]
    assert not long, "functions over 100 lines (split them into named steps):\n" + "\n".join(long)


def test_long_function_finder_finds_one(tmp_path: pathlib.Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    f = tmp_path / "m.py"
    inner = body.replace("    ", "        ")
    f.write_text(f"def long():\n{body}\n\n@hl.kernel\ndef k():\n{body}\n\ndef factory():\n"
                 f"    @hl.kernel(threads=128)\n    def k():\n{inner}\n    return k\n")
    assert _long_functions(f) == [("long", MAX_FUNCTION_LINES + 1)]
