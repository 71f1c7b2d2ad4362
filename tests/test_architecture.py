"""The rules of the house (docs/design.md), held by tests.

1. Same room, same name: every backend has one module per cell with the backend protocol's
   functions, names and signatures.
2. Imports point down: ``_core`` imports only NumPy and the standard library; a backend only
   its own package and ``_core``; the face reaches ``cpu`` and ``gpu`` only through
   ``_dispatch``; nothing imports ``benchmarks``.
3. Each fact is spelled once: no literal tuple of argument or field names outside ``_core``.
4. Validation checks, dispatch chooses: neither imports the other's job.
5. Functions fit on a screen: none over 60 lines outside the kernel bodies.
6. The public face is typed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

import pytest

import gradcells as gc
from gradcells._core import specs, types

ROOT = Path(gc.__file__).parent
BACKENDS = ("reference", "cpu", "gpu")
KERNEL_FILES = ("cpu/_lstm_kernels.py", "cpu/_gru_kernels.py", "cpu/_rnn_kernels.py",
                "cpu/_jvp_kernels.py",
                "cpu/_activations.py")
MAX_FUNCTION_LINES = 60
STDLIB = sys.stdlib_module_names


def _modules():
    return [path.relative_to(ROOT).as_posix() for path in sorted(ROOT.rglob("*.py"))]


def _imports(path):
    """Every module ``path`` imports, as absolute dotted names."""
    package = ["gradcells", *path.relative_to(ROOT).parent.parts]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if node.module is None:
                yield from (f"{module}.{alias.name}" for alias in node.names)
            else:
                yield module


def _top(name):
    return name.split(".")[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", specs.CELLS)
def test_every_backend_has_each_cell_with_the_protocols_signatures(backend, cell):
    module = importlib.import_module(f"gradcells.{backend}.{cell}")
    package = importlib.import_module(f"gradcells.{backend}")
    protocol = types.CELL_PROTOCOLS[cell]
    for name, method in inspect.getmembers(protocol, inspect.isfunction):
        if name.startswith("_"):
            continue
        expected = inspect.signature(method)
        expected = expected.replace(parameters=list(expected.parameters.values())[1:])
        actual = inspect.signature(getattr(module, name))
        assert [(p.name, p.kind, p.default) for p in actual.parameters.values()] == [
            (p.name, p.kind, p.default) for p in expected.parameters.values()], (
            f"gradcells.{backend}.{cell}.{name}{actual} differs from the protocol {expected}")
        assert getattr(package, name) is getattr(module, name), f"{backend}.{name} re-export"


def test_every_forward_op_has_its_public_function_and_gradient():
    for spec in specs.OPS.values():
        assert callable(getattr(gc, spec.name)) and callable(getattr(gc, spec.grad_name))


@pytest.mark.parametrize("name", _modules())
def test_imports_point_down(name):
    imported = set(_imports(ROOT / name))
    if name.startswith("_core/"):
        allowed = {m for m in imported if _top(m) in STDLIB or _top(m) == "numpy"
                   or m.startswith("gradcells._core")}
        assert imported == allowed, f"_core imports {sorted(imported - allowed)}"
    backend = name.split("/")[0]
    if backend in BACKENDS and "/" in name:
        inside = [m for m in imported if m.startswith("gradcells")]
        wrong = [m for m in inside
                 if not (m.startswith(f"gradcells.{backend}") or m.startswith("gradcells._core"))]
        assert not wrong, f"the {backend} backend imports {wrong}"
    if name != "_dispatch.py" and backend not in BACKENDS:
        direct = [m for m in imported if m.split(".")[:2] in (["gradcells", "cpu"],
                                                             ["gradcells", "gpu"])]
        assert not direct, f"{name} reaches a backend without _dispatch: {direct}"
    assert not any(_top(m) == "benchmarks" for m in imported)


def test_validation_checks_and_dispatch_chooses():
    validation = sorted((ROOT / "_validate").glob("*.py"))
    assert validation, "gradcells/_validate/ holds the validation's modules"
    for path in validation:
        assert "gradcells._dispatch" not in set(_imports(path)), path.name
    assert not any(m.startswith("gradcells._validate") for m in _imports(ROOT / "_dispatch.py"))


def _name_tuples():
    """Every field tuple of the shared types with three or more names."""
    named = [cls._fields for cls in vars(types).values()
             if isinstance(cls, type) and hasattr(cls, "_fields") and len(cls._fields) >= 3]
    return [set(fields) for fields in named] + [set(specs.PEEPHOLES)]


@pytest.mark.parametrize("name", [m for m in _modules() if not m.startswith("_core/")])
def test_no_literal_tuple_of_names_outside_the_specs(name):
    facts = _name_tuples()
    for node in ast.walk(ast.parse((ROOT / name).read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) >= 3:
            values = {e.value for e in node.elts
                      if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            assert not any(fact <= values for fact in facts), (
                f"{name}:{node.lineno} spells {sorted(values)}; read it from gradcells._core")


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


@pytest.mark.parametrize("path", sorted((ROOT.parent / "tests").glob("*.py"))
                         + sorted((ROOT.parent / "benchmarks").glob("*.py")),
                         ids=lambda p: p.name)
def test_tests_and_benchmarks_read_the_peephole_names_from_the_specs(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == len(specs.PEEPHOLES):
            values = tuple(e.value for e in node.elts if isinstance(e, ast.Constant))
            assert values != specs.PEEPHOLES, f"{path.name}:{node.lineno}: use PEEPHOLES"


def test_the_package_says_it_is_typed():
    assert (ROOT / "py.typed").is_file()
