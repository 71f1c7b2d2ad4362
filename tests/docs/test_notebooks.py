"""The teaching notebooks: stored in sync with their sources, stored executed, and executed
here top to bottom in a fresh kernel so that none can rot.

Each notebook is built from ``notebooks/src/NN_*.py`` (jupytext's percent format, paired with
the stored ``.ipynb`` through jupytext) by ``notebooks/_build.py``; the stored ``.ipynb`` holds
its outputs for the repository page. Figures render through matplotlib's
inline backend (Agg drawing to PNG; no display needed). Notebook 6 is also run with
TensorFlow and PyTorch hidden, to check that it skips their parts cleanly, and notebook 10
with PyTorch hidden.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
jupytext = pytest.importorskip("jupytext")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
MAX_NOTEBOOK_BYTES = 400_000


def _load_builder():
    spec = importlib.util.spec_from_file_location("_notebook_build", NOTEBOOK_DIR / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_builder()
SOURCES = build.source_paths()
IDS = [source.stem for source in SOURCES]


def _outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def _png_cells(nb):
    """Indices of the cells that display a PNG figure."""
    return [k for k, cell in enumerate(nb.cells) if cell.cell_type == "code"
            and any("image/png" in out.get("data", {}) for out in cell.outputs)]


def _text(nb):
    return "\n".join(out.get("text", "") for out in _outputs(nb))


@pytest.fixture(scope="session")
def kernel_env():
    """Environment for the kernels: the ``python3`` kernelspec present (installed for this
    user if missing), this interpreter first on PATH (the spec launches ``python``), and the
    inline backend, which draws with Agg."""
    from jupyter_client.kernelspec import KernelSpecManager

    if build.KERNEL_NAME not in KernelSpecManager().find_kernel_specs():
        import subprocess

        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name",
                        build.KERNEL_NAME], check=True, capture_output=True)
    return {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "MPLBACKEND": build.INLINE_BACKEND}


def _execute(path, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return build.execute(nb)


def test_there_are_thirteen_notebooks_and_nine_plot():
    assert [s.stem[:2] for s in SOURCES] == [f"{k:02d}" for k in range(1, 14)]
    stored = [nbformat.read(build.notebook_path(s), as_version=4) for s in SOURCES]
    assert sum(bool(_png_cells(nb)) for nb in stored) >= 9


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_stored_notebook_matches_its_source(source):
    """Both halves of the pair, read by jupytext, hold the same cells."""
    stored = build.read_stored(build.notebook_path(source))
    assert build.cell_sources(stored) == build.cell_sources(build.read_source(source)), (
        f"{source.name} changed: rebuild with `python notebooks/_build.py {source.stem[:2]}`")


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_notebook_and_source_name_their_pairing(source):
    stored = nbformat.read(build.notebook_path(source), as_version=4)
    assert stored.metadata["jupytext"]["formats"] == build.PAIRING
    assert build.read_source(source).metadata["jupytext"]["formats"] == build.PAIRING


def test_a_stale_notebook_is_detected(tmp_path, monkeypatch):
    """An edited source no longer matches its stored notebook; ``--check`` says so."""
    source = SOURCES[0]
    edited = tmp_path / "src" / source.name
    edited.parent.mkdir()
    edited.write_text(source.read_text(encoding="utf-8") + "\n# %%\nprint('new cell')\n",
                      encoding="utf-8")
    (tmp_path / build.notebook_path(source).name).write_bytes(
        build.notebook_path(source).read_bytes())
    monkeypatch.setattr(build, "NOTEBOOK_DIR", tmp_path)
    assert build.stale_notebooks([edited]) == [build.notebook_path(source).name]
    assert build.stale_notebooks([source]) == []


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_stored_notebook_is_executed_and_small(source):
    path = build.notebook_path(source)
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert not [out for out in _outputs(nb) if out.output_type == "error"]
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_notebook_runs_top_to_bottom(source, monkeypatch, kernel_env):
    path = build.notebook_path(source)
    fresh = _execute(path, monkeypatch, kernel_env)  # raises CellExecutionError on any error
    stored = nbformat.read(path, as_version=4)
    assert _png_cells(fresh) == _png_cells(stored)
    assert "UNEXPECTED" not in _text(fresh)


def test_audit_notebook_skips_absent_frameworks(tmp_path, monkeypatch, kernel_env):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name in ("tensorflow", "torch"):
        (hidden / f"{name}.py").write_text(f"raise ImportError('{name} hidden by the test')\n")
    env = dict(kernel_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hidden),
                                                      os.environ.get("PYTHONPATH")]))
    [source] = [s for s in SOURCES if s.stem.startswith("06")]
    text = _text(_execute(build.notebook_path(source), monkeypatch, env))
    assert "TensorFlow: absent   PyTorch: absent" in text
    table = text[text.rindex("framework"):]
    assert table.count("skipped: not installed") == 2
    assert "known fault" not in table and "agrees" not in table


def test_second_order_notebook_skips_absent_torch(tmp_path, monkeypatch, kernel_env):
    """Notebook 10 compares its Hessian-vector product with PyTorch's when PyTorch is there;
    without it that comparison is skipped, with a note, and the rest still runs."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "torch.py").write_text("raise ImportError('torch hidden by the test')\n")
    env = dict(kernel_env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hidden),
                                                      os.environ.get("PYTHONPATH")]))
    [source] = [s for s in SOURCES if s.stem.startswith("10")]
    text = _text(_execute(build.notebook_path(source), monkeypatch, env))
    assert "PyTorch is not installed: the comparison with torch.autograd.functional.hvp" in text
    assert "max |torch's H·t" not in text
