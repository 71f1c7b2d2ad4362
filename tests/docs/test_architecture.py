"""The rules of the house (docs/design.md), held by tests.

1. A cell is a folder: every registered cell has one module per backend with the backend
   contract's functions, names and signatures.
2. Imports point down: ``_core`` imports only NumPy and the standard library; a backend's
   machinery only its own package and ``_core``; a cell's folder only ``_core`` and the
   machinery (never another cell); the face reaches the cells only through ``_dispatch``;
   nothing imports ``benchmarks``.
3. The import graph (function-level imports included) has no cycles; no function imports
   anything but an optional third-party library; no module imports another module's private
   (underscored) name, except from ``_core`` and the backend machinery.
4. Each fact is spelled once: no literal tuple of argument or field names outside ``_core``.
5. Validation checks, dispatch chooses: neither imports the other's job.
6. Functions fit on a screen: none over 60 lines outside the kernel bodies.
7. The public face is typed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

import pytest

import gradcells as gc
from gradcells import cells
from gradcells.cells.lstm.spec import PEEPHOLES

ROOT = Path(gc.__file__).parent
BACKENDS = cells.BACKENDS
MACHINERY = ("_core", "cpu", "gpu")       # shared by every cell: private names may be imported
KERNEL_FILES = tuple(f"cells/{cell}/_cpu_kernels.py" for cell in cells.CELLS) + (
    "cpu/_activations.py",)
MAX_FUNCTION_LINES = 60
STDLIB = sys.stdlib_module_names
# The libraries a function may import: optional extras, imported only when a caller uses them,
# and Numba's submodules, whose import the CPU machinery defers (``cpu/_compile.py``).
OPTIONAL = {"numba", "torch", "jax", "jaxlib", "cupy", "cupyx", "dask", "distributed", "tensorflow",
            "keras", "flax", "onnx", "onnxruntime", "hypothesis", "matplotlib", "threadpoolctl",
            "minGRU_pytorch", "xlstm", "recurrentgemma", "einops"}


def _modules():
    return [path.relative_to(ROOT).as_posix() for path in sorted(ROOT.rglob("*.py"))]


def _dotted(name):
    """``cells/lstm/cpu.py`` -> ``gradcells.cells.lstm.cpu`` (a package: its ``__init__``)."""
    parts = ["gradcells", *Path(name).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_dotted(name): name for name in _modules()}


class Import:
    """One imported module (or a name from it) of one statement."""

    def __init__(self, node, module, name, in_function):
        self.line, self.module, self.name, self.in_function = node.lineno, module, name, in_function

    @property
    def private_name(self):
        """The imported name, if it is an underscored name that is not a module."""
        name = self.name
        if name and name.startswith("_") and not name.startswith("__") \
                and f"{self.module}.{name}" not in MODULES:
            return name
        return None


def _imports_of(name):
    """Every ``Import`` of module ``name`` (a path under ``gradcells/``), function-level ones
    included, as absolute dotted module names."""
    path = ROOT / name
    package = _dotted(name).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inner = {id(node) for function in ast.walk(tree)
             if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(function)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node, alias.name, None, id(node) in inner)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{module}.{alias.name}"
                target, imported = (full, None) if full in MODULES else (module, alias.name)
                yield Import(node, target, imported, id(node) in inner)


def _imports(path):
    """Every module ``path`` imports, as absolute dotted names."""
    yield from (i.module for i in _imports_of(path.relative_to(ROOT).as_posix()))


def _top(name):
    return name.split(".")[0]


def _owner(module):
    """The gradcells module a dotted import resolves to (a name inside it stripped)."""
    while module not in MODULES and "." in module:
        module = module.rsplit(".", 1)[0]
    return module


def _graph():
    return {module: {_owner(i.module) for i in _imports_of(name)
                     if _top(i.module) == "gradcells" and _owner(i.module) != module}
            for module, name in MODULES.items()}


def _cycles(graph):
    """The strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
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
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for vertex in graph:
        if vertex not in index:
            visit(vertex)
    return found


def test_the_import_graph_has_no_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", _modules())
def test_no_function_imports_anything_but_an_optional_library(name):
    inside = [f"{i.module}:{i.line}" for i in _imports_of(name)
              if i.in_function and _top(i.module) not in OPTIONAL]
    assert not inside, f"{name} imports inside a function: {inside}"


@pytest.mark.parametrize("name", _modules())
def test_no_private_name_is_imported_from_another_module(name):
    def shared(module):
        return any(module.startswith(f"gradcells.{room}") for room in MACHINERY)

    private = [f"{i.module}.{i.private_name}:{i.line}" for i in _imports_of(name)
               if i.private_name and _top(i.module) == "gradcells" and not shared(i.module)]
    assert not private, f"{name} imports private names: {private}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", cells.CELLS)
def test_every_cell_has_each_backend_with_the_contracts_signatures(backend, cell):
    module = cells.implementation(cell, backend)
    protocol = cells.CELL_PROTOCOLS[cell]
    for name, method in inspect.getmembers(protocol, inspect.isfunction):
        if name.startswith("_"):
            continue
        expected = inspect.signature(method)
        expected = expected.replace(parameters=list(expected.parameters.values())[1:])
        actual = inspect.signature(getattr(module, name))
        assert [(p.name, p.kind, p.default) for p in actual.parameters.values()] == [
            (p.name, p.kind, p.default) for p in expected.parameters.values()], (
            f"{module.__name__}.{name}{actual} differs from the contract {expected}")
    for op in (o for o in cells.OPS if o.startswith(f"{cell}_")):
        for suffix in ("", "_grad", "_jvp", "_grad_jvp"):
            assert callable(getattr(module, op + suffix)), f"{module.__name__} lacks {op}{suffix}"


def test_every_forward_op_has_its_public_function_and_gradient():
    for spec in cells.OPS.values():
        assert callable(getattr(gc, spec.name)) and callable(getattr(gc, spec.grad_name))


def _room(name):
    """``_core``, ``cpu``, ``gpu``, ``cells/<cell>`` or the module's own name."""
    parts = Path(name).parts
    return "/".join(parts[:2]) if parts[0] == "cells" and len(parts) > 2 else parts[0]


def _declarations(module):
    """Whether ``module`` is the registry or a cell's declarations (``gradcells.cells``,
    ``gradcells.cells.<cell>.spec``): data the public face reads, no backend."""
    return module == "gradcells.cells" or (module.startswith("gradcells.cells.")
                                           and module.endswith(".spec"))


@pytest.mark.parametrize("name", _modules())
def test_imports_point_down(name):
    imported = set(_imports(ROOT / name))
    inside = {m for m in imported if _top(m) == "gradcells"}
    room = _room(name)
    if room == "_core":
        allowed = {m for m in imported if _top(m) in STDLIB or _top(m) == "numpy"
                   or m.startswith("gradcells._core")}
        assert imported == allowed, f"_core imports {sorted(imported - allowed)}"
    if room in ("cpu", "gpu"):
        wrong = [m for m in inside if not m.startswith((f"gradcells.{room}", "gradcells._core"))]
        assert not wrong, f"the {room} machinery imports {wrong}"
    if room.startswith("cells/"):
        own = "gradcells." + room.replace("/", ".")
        wrong = [m for m in inside if not m.startswith(
            (own, "gradcells._core", "gradcells.cpu", "gradcells.gpu"))]
        assert not wrong, f"the cell {room} imports {wrong}"
    if name.startswith("cells/") and name.endswith("/spec.py"):
        wrong = [m for m in inside if not m.startswith("gradcells._core")]
        assert not wrong, f"a cell's declarations import only _core: {name} imports {wrong}"
    if room not in ("cpu", "gpu", "_dispatch.py", "reference.py") and not room.startswith("cells"):
        direct = [m for m in inside if m.split(".")[1:2] in (["cells"], ["cpu"], ["gpu"])
                  and not _declarations(m)]
        assert not direct, f"{name} reaches a backend without _dispatch: {direct}"
    assert not any(_top(m) == "benchmarks" for m in imported)


def test_validation_checks_and_dispatch_chooses():
    validation = sorted((ROOT / "_validate").glob("*.py"))
    assert validation, "gradcells/_validate/ holds the validation's modules"
    for path in validation:
        assert "gradcells._dispatch" not in set(_imports(path)), path.name
    assert not any(m.startswith("gradcells._validate") for m in _imports(ROOT / "_dispatch.py"))


def _name_tuples():
    """Every field tuple of the cells' types with three or more names."""
    named = [cls._fields for cell in cells.CELLS
             for cls in vars(importlib.import_module(f"gradcells.cells.{cell}.spec")).values()
             if isinstance(cls, type) and hasattr(cls, "_fields") and len(cls._fields) >= 3]
    return [set(fields) for fields in named] + [set(PEEPHOLES)]


@pytest.mark.parametrize("name", [m for m in _modules() if not m.startswith("_core/")
                                  and not m.endswith("/spec.py")])
def test_no_literal_tuple_of_names_outside_the_specs(name):
    facts = _name_tuples()
    for node in ast.walk(ast.parse((ROOT / name).read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) >= 3:
            values = {e.value for e in node.elts
                      if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            assert not any(fact <= values for fact in facts), (
                f"{name}:{node.lineno} spells {sorted(values)}; read it from the cell's spec")


@pytest.mark.parametrize("name", [m for m in _modules() if m not in KERNEL_FILES])
def test_functions_fit_on_a_screen(name):
    for node in ast.walk(ast.parse((ROOT / name).read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - first + 1
            assert length <= MAX_FUNCTION_LINES, f"{name}:{node.name} has {length} lines"


def _public_functions():
    for module in (gc, gc.layouts, gc.tf_compat, gc.testing):
        prefix = "" if module is gc else module.__name__.split(".")[-1] + "."
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value):
                yield prefix + name, value


@pytest.mark.parametrize(("name", "function"), list(_public_functions()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_the_public_face_is_typed(name, function):
    signature = inspect.signature(inspect.unwrap(function))
    missing = [p.name for p in signature.parameters.values()
               if p.annotation is inspect.Parameter.empty]
    assert not missing, f"gc.{name}: parameters without a type: {missing}"
    assert signature.return_annotation is not inspect.Signature.empty, f"gc.{name} -> ?"


@pytest.mark.parametrize("path", sorted((ROOT.parent / "tests").rglob("*.py"))
                         + sorted((ROOT.parent / "benchmarks").glob("*.py")),
                         ids=lambda p: p.relative_to(ROOT.parent).as_posix())
def test_tests_and_benchmarks_read_the_peephole_names_from_the_specs(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == len(PEEPHOLES):
            values = tuple(e.value for e in node.elts if isinstance(e, ast.Constant))
            assert values != PEEPHOLES, f"{path.name}:{node.lineno}: use PEEPHOLES"


def test_the_package_says_it_is_typed():
    assert (ROOT / "py.typed").is_file()
