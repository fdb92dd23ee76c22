"""The package's structure, read from its source: imports only go down the layers, the designs
are named in one table, functions and files stay small, importing the package changes nothing
in the process, and the benchmark scripts use the public API and stand alone.

The import graph is built with ``ast`` from every ``import`` statement of ``src/mla_var3``, at
any depth (a lazy import inside a function is a dependency too). ``import a.b.c`` and
``from a.b import c`` point at the module ``a.b.c`` when it exists, else at the package; the
package ``__init__`` a submodule import runs first is not an edge (every ``__init__`` that
re-exports its submodules would be a cycle). Imports by name through ``importlib`` (the design
table's entry points, the backend registry's plugin packages) are not edges: they name a module
without using its code.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mla_var3 import designs

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "mla_var3"

#: import cycles still in the package, in modules being rewritten elsewhere; delete an entry
#: when its cycle is gone (the test fails until then, so the list cannot go stale).
KNOWN_CYCLES: set = set()

#: imports against the one-way rules, in modules being rewritten elsewhere (delete when gone).
KNOWN_BACK_IMPORTS: set = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _resolve(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> set[str]:
    """The package's modules ``module`` imports (at any depth of its source)."""
    out = set()
    is_package = MODULES[module].name == "__init__.py"
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            out |= {_resolve(a.name) for a in node.names if a.name.split(".")[0] == "mla_var3"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = f"{parent}.{base}".rstrip(".")
            if base.split(".")[0] != "mla_var3":
                continue
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else _resolve(base) for a in node.names}
    out.discard(module)
    return out


GRAPH = {module: _imports(module) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_lazy_and_relative_imports():
    assert "mla_var3.model.attention" in GRAPH["mla_var3.model.layer"]
    # a function-level import is an edge: the kernel CLI's import of the launchers by name
    assert "mla_var3.kernel.launchers" in GRAPH["mla_var3.kernel.__main__"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}


def test_no_import_cycles_but_the_known_ones():
    found = _cycles(GRAPH)
    new = found - KNOWN_CYCLES
    assert not new, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = KNOWN_CYCLES - found
    assert not gone, f"cycles gone, delete them from KNOWN_CYCLES: {gone}"


def _edges(source: str, target: str) -> set[tuple[str, str]]:
    """Imports from modules under ``source`` to modules under ``target`` (dotted prefixes)."""
    def under(module: str, prefix: str) -> bool:
        return module == prefix or module.startswith(prefix + ".")

    return {(a, b) for a, targets in GRAPH.items() if under(a, source) for b in targets if under(b, target)}


#: the layers, lowest first: a module imports modules of its own layer or of a lower one, never
#: of a higher one. ``conf`` (data files) sits with the foundation; the package itself
#: (``mla_var3/__init__.py``, the public API re-exported) and ``python -m mla_var3`` are on top.
LAYERS = (
    ("shapes", "designs", "_io", "_argtypes", "_values", "testing", "conf"),     # the foundation
    ("analysis", "reference"),
    ("runtime",),
    ("kernel",),
    ("dispatch",),
    ("model", "compat"),
    ("integrations", "cli", "__main__"),
)


def _layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s top-level part (the package root: the top)."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS)
    found = [i for i, names in enumerate(LAYERS) if parts[1] in names]
    assert found, f"{module} is in no layer: add its package to LAYERS"
    return found[0]


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The imports of ``graph`` that go up the layers."""
    return {(a, b) for a, targets in graph.items() for b in targets if _layer(b) > _layer(a)}


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_only_go_down_the_layers():
    """No module imports one of a higher layer, a function-level import included."""
    up = _upward(GRAPH)
    assert not up, "imports going up the layers: " + "; ".join(f"{a} -> {b}" for a, b in sorted(up))


def test_the_layer_check_sees_an_upward_import():
    graph = {"mla_var3.runtime.x": {"mla_var3.compat", "mla_var3.shapes"}, "mla_var3.kernel.y": {"mla_var3.runtime.x"},
             "mla_var3.cli.z": {"mla_var3.kernel.y"}}
    assert _upward(graph) == {("mla_var3.runtime.x", "mla_var3.compat")}


@pytest.mark.parametrize("source,target,allowed", [
    # the dispatcher decides without torch or the model; the model asks it
    ("mla_var3.dispatch", "mla_var3.model", set()),
    # the portable kernels never import the Hopper ones: those register themselves; the
    # registry only asks the Gluon guard whether Gluon imports
    ("mla_var3.kernel.absorbed", "mla_var3.kernel.hopper", KNOWN_BACK_IMPORTS),
    ("mla_var3.kernel.expanded", "mla_var3.kernel.hopper", set()),
    ("mla_var3.kernel.hybrid", "mla_var3.kernel.hopper", set()),
    ("mla_var3.kernel.gemm", "mla_var3.kernel.hopper", set()),
    ("mla_var3.kernel.combine", "mla_var3.kernel.hopper", set()),
    ("mla_var3.kernel.backends", "mla_var3.kernel.hopper", {("mla_var3.kernel.backends",
                                                             "mla_var3.kernel.hopper._gluon")}),
    # the hybrid cache builds on the latent one, not the other way round
    ("mla_var3.model.cache", "mla_var3.model.hybrid_cache", set()),
    # the design table and the shapes are leaves
    ("mla_var3.designs", "mla_var3", set()),
    ("mla_var3.shapes", "mla_var3", set()),
])
def test_imports_flow_one_way(source, target, allowed):
    assert _edges(source, target) == allowed


# --------------------------------------------------------------------------- the design table

#: every name the table gives a design: canonical, kernel, layer mode, aliases
NAMES = {n for d in designs.DESIGNS for n in (d.name, d.kernel, d.mode, *d.aliases)}


def _str_elements(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Dict):
        elements = [k for k in node.keys if k is not None]
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        elements = node.elts
    else:
        return []
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def test_lists_of_designs_only_in_the_table():
    """No tuple, list, set or dict literal outside ``designs.py`` names two designs (an
    ``__all__`` of function names aside): every list of designs is read from the table."""
    exports = {id(node.value) for tree in TREES.values() for node in ast.walk(tree)
               if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)}
    found = []
    for module, tree in TREES.items():
        if module == "mla_var3.designs":
            continue
        for node in ast.walk(tree):
            named = {designs.design(s).name for s in _str_elements(node) if s in NAMES}
            if len(named) >= 2 and id(node) not in exports:
                found.append(f"{module}:{node.lineno}")
    assert not found, f"lists of designs outside mla_var3.designs: {found}"


def _compared_names(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants compared (==, !=, in) with a variable called design, designs, mode or kernel."""
    def ident(node):
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(ident(s) in ("design", "designs", "m_design", "mode", "kernel") for s in sides):
                out += [(node.lineno, s.value) for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
                out += [(node.lineno, v) for s in sides for v in _str_elements(s)]
    return out


def test_design_names_compared_anywhere_are_the_tables():
    """Every design name the CLI, the dispatcher, the layer and the bench compare against is a
    name the table knows (a stale or misspelt name fails here)."""
    unknown = [f"{module}:{line} {value!r}" for module, tree in TREES.items()
               for line, value in _compared_names(tree) if value not in NAMES | {"auto"}]
    assert not unknown, unknown


def test_consumers_read_the_table():
    import importlib

    import mla_var3
    from mla_var3 import cli
    from mla_var3.dispatch.decide import ALIASES, CACHE_KINDS, DESIGN_NAMES as DESIGNS, KERNEL

    (cost, kernel, kernel_cli, backend, layer, sweep) = (
        importlib.import_module(f"mla_var3.{m}") for m in (
            "analysis.cost", "kernel", "kernel.__main__", "model.backend", "model.layer",
            "cli.sweep"))

    table = designs.DESIGNS
    kernels = tuple(d.kernel for d in table)
    assert DESIGNS == tuple(d.name for d in table)
    assert dict(KERNEL) == {d.name: d.kernel for d in table}
    assert set(ALIASES) | set(DESIGNS) == NAMES
    assert CACHE_KINDS == designs.CACHE_KINDS
    assert layer.MODES == tuple(d.mode for d in table)
    assert designs.ATTENTION_KERNELS == kernels == tuple(cost.DESIGN_MODELS)
    assert sweep.BenchSpec(dims=None).designs == kernels
    assert backend.FUNCTIONS == tuple(designs.KERNELS)
    assert set(designs.KERNELS) <= set(mla_var3.__all__) and set(designs.KERNELS) <= set(kernel.__all__)
    parser = kernel_cli._parser()
    assert next(a for a in parser._actions if a.dest == "design").choices == kernels
    explain = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["explain"]
    assert set(next(a for a in explain._actions if a.dest == "design").choices) == NAMES | {"auto"}


def test_the_names_are_documented_once_as_they_are():
    """The design table's docstring lists each design's names (public, design, mode, aliases,
    title) as the table holds them: the one place the aliases are written down."""
    table = designs.__doc__.split("public name         design")[1].split("\n\n")[0]
    rows = [line.split() for line in table.splitlines() if line.startswith("``")]
    listed = [(r[0], r[1], r[2], r[3], " ".join(r[4:])) for r in rows]
    strip = lambda x: x.strip("`")  # noqa: E731
    assert [tuple(map(strip, row)) for row in listed] == [
        (d.kernel, d.name, d.mode, ",".join(d.aliases), d.title) for d in designs.DESIGNS]


def test_the_table_names_what_exists():
    """Each kernel's module defines it and its config type; each design module takes the one
    config signature ``(dims, problem, *, device=None)``."""
    import importlib
    import inspect

    from mla_var3.analysis.cost import COST_MODELS
    from mla_var3.shapes import Problem, get_preset

    dims = get_preset("deepseek-v3")
    for k in designs.KERNELS.values():
        module = importlib.import_module(k.module)
        assert callable(getattr(module, k.name)) and isinstance(getattr(module, k.config), type), k
        assert k.cost_model in COST_MODELS, k
    for d in designs.DESIGNS:
        assert designs.design(d.kernel) is designs.design(d.mode) is designs.design(d.name) is d
        module = importlib.import_module(designs.KERNELS[d.kernel].module)
        config_type = getattr(module, designs.KERNELS[d.kernel].config)
        if d.name == "absorbed":
            continue  # its module keeps its launcher's sizes (kernel.launchers adapts them)
        for fn in (module.default_config, module.candidate_configs):
            assert list(inspect.signature(fn).parameters) == ["dims", "problem", "device"], fn
        problem = Problem(b=2, s=4, t=256, n=64 if d.split else None)
        assert isinstance(module.default_config(dims, problem), config_type)
        assert module.default_config(dims, problem) in module.candidate_configs(dims, problem)
    with pytest.raises(ValueError, match="unknown design 'flashinfer'"):
        designs.design("flashinfer")


# ------------------------------------------------------------------------ one meaning per name

#: modules binding ``DESIGNS`` besides the design table, being rewritten elsewhere: the
#: dispatcher's is the designs' canonical names (read them from the table instead). Delete an
#: entry when its binding is gone (the test fails until then, so the list cannot go stale).
KNOWN_DESIGNS_BINDINGS: set[str] = set()


def _binds(tree: ast.AST, name: str) -> list[int]:
    """Lines of ``tree`` that bind ``name``: an assignment to it, a ``def`` or ``class`` of it, or
    an import of it from anywhere but the design table."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)):
            targets = [node.target]
        else:
            targets = []
        lines += [node.lineno for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and n.id == name]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            lines.append(node.lineno)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            from_table = isinstance(node, ast.ImportFrom) and not node.level and node.module == "mla_var3.designs"
            lines += [node.lineno for a in node.names if (a.asname or a.name.split(".")[-1]) == name and not from_table]
    return lines


def test_designs_is_bound_in_one_module():
    """``DESIGNS`` means the design table (:data:`mla_var3.designs.DESIGNS`) wherever it is bound."""
    assert _binds(ast.parse("DESIGNS = ()\nfrom mla_var3.dispatch.decide import DESIGNS\n"
                            "from mla_var3.designs import DESIGNS"), "DESIGNS") == [1, 2]
    bound = {m for m, tree in TREES.items() if m != "mla_var3.designs" and _binds(tree, "DESIGNS")}
    assert not bound - KNOWN_DESIGNS_BINDINGS, f"DESIGNS bound outside the design table: {bound - KNOWN_DESIGNS_BINDINGS}"
    gone = KNOWN_DESIGNS_BINDINGS - bound
    assert not gone, f"bindings gone, delete them from KNOWN_DESIGNS_BINDINGS: {gone}"


def test_one_module_named_designs():
    """``designs`` is the design table alone (the launchers by name were once a second one)."""
    assert [m for m in MODULES if m.rpartition(".")[2] == "designs"] == ["mla_var3.designs"]


# --------------------------------------------------------------------------------- small sizes

MAX_FUNCTION_LINES = 100
MAX_FILE_LINES = 800
#: what is over the limits in modules being rewritten elsewhere (the plan/run change), per file
#: under ``src/mla_var3``: the functions (qualified names) and ``<file>`` for the file itself.
#: Delete an entry when it is within the limits (the test fails until then, so the list cannot
#: go stale); the list is to end empty.
KNOWN_TOO_LONG = {
}


def _is_jit(fn: ast.AST) -> bool:
    """A ``@triton.jit`` / ``@gluon.jit`` kernel body (called with arguments or not)."""
    return any(ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1] == "jit"
               for d in fn.decorator_list)


def _too_long(tree: ast.AST, n_lines: int) -> set[str]:
    """What of one file is over the limits: host (non-jit) functions longer than
    :data:`MAX_FUNCTION_LINES`, by qualified name, and ``<file>`` past :data:`MAX_FILE_LINES`."""
    out = {"<file>"} if n_lines > MAX_FILE_LINES else set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if (not isinstance(child, ast.ClassDef) and not _is_jit(child)
                        and child.end_lineno - child.lineno + 1 > MAX_FUNCTION_LINES):
                    out.add(name)
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def test_the_size_check_sees_long_functions_not_kernels():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    code = f"class A:\n  def host(self):\n{body}\n@triton.jit\ndef kernel():\n{body}\n@gluon.jit(x=1)\ndef g():\n{body}\n"
    assert _too_long(ast.parse(code), 10) == {"A.host"}
    assert _too_long(ast.parse("x = 1"), MAX_FILE_LINES + 1) == {"<file>"}


def test_functions_and_files_are_small():
    """No host function longer than 100 lines (``@jit`` kernel bodies are exempt) and no file in
    ``src/`` longer than 800 lines, but the known ones."""
    found = {}
    for module, path in MODULES.items():
        over = _too_long(TREES[module], len(path.read_text().splitlines()))
        if over:
            found[path.relative_to(PACKAGE).as_posix()] = over
    new = {f: over - KNOWN_TOO_LONG.get(f, set()) for f, over in found.items()}
    assert not {f: o for f, o in new.items() if o}, f"too long: {new}"
    gone = {f: names - found.get(f, set()) for f, names in KNOWN_TOO_LONG.items()}
    assert not {f: g for f, g in gone.items() if g}, f"within the limits now, delete from KNOWN_TOO_LONG: {gone}"


# ------------------------------------------------------------------------------ side effects


def test_importing_the_package_leaves_the_environment_alone():
    """Importing every library module (the programs' own modules aside: they select Triton's
    interpreter for themselves; the transformers integration too when transformers is not
    installed) sets no environment variable, TRITON_INTERPRET included; the design table, the
    dispatcher and the analysis import without torch."""
    import importlib.util

    programs = {"mla_var3.__main__", "mla_var3.kernel.__main__", "mla_var3.kernel.selfcheck"}
    # an integration imports its library (an optional extra): left out where it is not installed
    missing = {m for m in MODULES if m.startswith("mla_var3.integrations.")
               and importlib.util.find_spec("transformers") is None}
    library = sorted(m for m in MODULES if m not in programs | missing)
    code = ("import os, sys\n"
            "import mla_var3.designs, mla_var3.dispatch, mla_var3.analysis, mla_var3.shapes\n"
            "assert 'torch' not in sys.modules, 'torch imported by the torch-free modules'\n"
            "before = dict(os.environ)\n"
            f"for m in {library!r}: __import__(m)\n"
            "changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}\n"
            "assert not changed, changed\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ----------------------------------------------------------------------------- docs to cite

DOCS = SRC.parent / "docs"
#: the longest section of a document that code may cite (a heading and what follows it, or a whole file)
MAX_CITED_LINES = 500
#: files that still cite a devlog by section number, being rewritten elsewhere: delete an entry when
#: its citations name a file and a heading (the test fails until then, so the list cannot go stale)
KNOWN_NUMBERED_CITATIONS: set[str] = set()
_PATH = r"docs/[\w./-]+\.md"
_CITATION = re.compile(rf"({_PATH})[`'\"]*((?:,\s*\"[^\"]+\"(?:\s*(?:and|;|,)\s*\"[^\"]+\")*)?)")
_NUMBERED = re.compile(rf"{_PATH}[`'\"]*,?\s*(?:§|section \d)")


def _flat(text: str) -> str:
    """Source text as prose: comment markers and line breaks taken out, so that a citation wrapped
    over lines reads as one."""
    return re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", text.replace('\\"', '"'))


def _sections(path: Path) -> dict[str, int]:
    """Each heading of a Markdown file -> the lines of its section (up to the next heading of the
    same or a higher level); the file itself under ""."""
    lines = path.read_text().splitlines()
    heads = [(i, len(m.group(1)), m.group(2).strip()) for i, line in enumerate(lines)
             if (m := re.match(r"^(#+) (.*)$", line))]
    out = {"": len(lines)}
    for j, (i, level, title) in enumerate(heads):
        end = next((k for k, lv, _ in heads[j + 1:] if lv <= level), len(lines))
        out.setdefault(title, end - i)
    return out


def _citations(text: str) -> list[tuple[str, list[str]]]:
    """``(path, [headings])`` of each docs citation in ``text``."""
    return [(m.group(1), re.findall(r"\"([^\"]+)\"", m.group(2))) for m in _CITATION.finditer(_flat(text))]


def test_the_citation_reader_takes_a_file_and_its_headings():
    text = ('# see docs/kernels/flash-mla/stalls.md,\n    # "Where the warps wait" and "Two kernel knobs"\n'
            '"""(``docs/cost-analysis.md``, "Notation"); docs/regimes.md."""')
    assert _citations(text) == [("docs/kernels/flash-mla/stalls.md", ["Where the warps wait", "Two kernel knobs"]),
                                ("docs/cost-analysis.md", ["Notation"]), ("docs/regimes.md", [])]
    assert _NUMBERED.search(_flat("(``docs/kernels/flash-mla.md`` §8)"))


def test_code_cites_a_file_and_a_heading_of_a_short_section():
    """Every citation of ``docs/`` in the package, the tests and the benchmarks names a file that
    exists and, optionally, headings in it; what it cites (the section, or the whole file when it
    names none) is at most 500 lines; no citation is a section number."""
    sources = [*PACKAGE.rglob("*.py"), *BENCHMARKS.glob("*.py"),
               *(p for p in SRC.parent.joinpath("tests").glob("*.py") if p.name != "test_structure.py")]
    bad, numbered = [], set()
    for path in sources:
        rel = path.relative_to(SRC.parent).as_posix()
        text = path.read_text()
        if _NUMBERED.search(_flat(text)):
            numbered.add(rel)
        if rel in KNOWN_NUMBERED_CITATIONS:
            continue
        for doc, headings in _citations(text):
            target = SRC.parent / doc
            if not target.is_file():
                bad.append(f"{rel}: {doc} does not exist")
                continue
            sections = _sections(target)
            for h in headings or [""]:
                found = [n for title, n in sections.items() if h and title.startswith(h) or title == h]
                if not found:
                    bad.append(f"{rel}: no heading {h!r} in {doc}")
                elif min(found) > MAX_CITED_LINES:
                    bad.append(f"{rel}: {doc} {h!r} is {min(found)} lines")
    assert not bad, bad
    assert not numbered - KNOWN_NUMBERED_CITATIONS, f"section numbers cited: {numbered - KNOWN_NUMBERED_CITATIONS}"
    gone = KNOWN_NUMBERED_CITATIONS - numbered
    assert not gone, f"no section numbers left, delete from KNOWN_NUMBERED_CITATIONS: {gone}"


def test_the_devlogs_are_split_by_topic():
    """No devlog file (``docs/kernels``) is longer than 500 lines: each can be cited whole."""
    long = {p.relative_to(DOCS).as_posix(): n for p in DOCS.joinpath("kernels").rglob("*.md")
            if (n := len(p.read_text().splitlines())) > MAX_CITED_LINES}
    assert not long, long


# ------------------------------------------------------------------------------ the benchmarks

BENCHMARKS = SRC.parent / "benchmarks"
MAX_BENCHMARK_SCRIPTS = 12
#: the module every suite shares (the input builder, the timing primitive, the record)
SHARED = "common"


def _benchmark_trees() -> dict[str, ast.AST]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(BENCHMARKS.glob("*.py"))}


def _private_uses(tree: ast.AST) -> list[str]:
    """What a script uses of the package beyond its public API: a private module or name
    imported (a part starting with ``_``), an attribute starting with ``_`` read from, or any
    attribute set on, a module of the package (a module-level knob)."""
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "mla_var3":
                    modules.add(a.asname or a.name.split(".")[0])
                    found += [a.name] if any(part.startswith("_") for part in a.name.split(".")) else []
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mla_var3":
            found += [node.module] if any(part.startswith("_") for part in node.module.split(".")) else []
            for a in node.names:
                if a.name.startswith("_"):
                    found.append(f"{node.module}.{a.name}")
                elif f"{node.module}.{a.name}" in MODULES:
                    modules.add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if node.attr.startswith("_") or isinstance(node.ctx, ast.Store):
                found.append(f"{node.value.id}.{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in modules):
            found.append(f"setattr({node.args[0].id}, ...)")
    return found


def test_the_public_api_check_sees_private_names_and_knobs():
    code = ("from mla_var3.kernel import _launch\nfrom mla_var3.kernel.absorbed import _REPLAYS\n"
            "from mla_var3.kernel import decode_plan as dp\nimport mla_var3.kernel.hopper.absorbed_seesaw as ss\n"
            "dp.PACKING_PAIRS_PER_SM = 1\nss._WORKER_REGS\nsetattr(dp, 'X', 1)\ndp.plan_decode\n")
    assert _private_uses(ast.parse(code)) == ["mla_var3.kernel._launch", "mla_var3.kernel.absorbed._REPLAYS",
                                              "dp.PACKING_PAIRS_PER_SM", "ss._WORKER_REGS", "setattr(dp, ...)"]


def test_benchmarks_are_a_few_suites_on_the_public_api():
    """At most 12 scripts; each imports no other script but the shared module (which imports
    none), and uses the package's public API only."""
    trees = _benchmark_trees()
    assert len(trees) <= MAX_BENCHMARK_SCRIPTS, sorted(trees)
    siblings = {}
    for name, tree in trees.items():
        imported = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        siblings[name] = imported & set(trees) - {name}
    assert siblings.pop(SHARED, set()) == set()
    assert all(s <= {SHARED} for s in siblings.values()), siblings
    private = {name: _private_uses(tree) for name, tree in trees.items()}
    assert not {n: p for n, p in private.items() if p}, private


def test_no_test_imports_a_benchmark_script():
    """A test imports no benchmark script, by name or from its file; it may run one as a program."""
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")}
    found = []
    for path in sorted(SRC.parent.joinpath("tests").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = ([a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import)
                     else [(node.module or "").split(".")[0]] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n in scripts]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                    node.func.attr == "spec_from_file_location"
                    or (node.func.attr in ("insert", "append") and ast.unparse(node.func.value) == "sys.path")):
                if "benchmarks" in ast.unparse(node):
                    found.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}")
    assert not found, found


def test_the_benchmarks_readme_lists_the_scripts():
    readme = (BENCHMARKS / "README.md").read_text()
    listed = {line.split("`")[1] for line in readme.splitlines() if line.startswith("| `") and ".py`" in line}
    assert listed == {p.name for p in BENCHMARKS.glob("*.py")} - {f"{SHARED}.py"}
