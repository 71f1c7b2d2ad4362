"""Hypothesis profiles and shared fixtures.

Profiles: ``dev`` (default; fewer examples, quick) and ``ci`` (derandomized, no deadline,
more examples). Select with ``HYPOTHESIS_PROFILE=ci`` or ``--hypothesis-profile=ci``.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


@pytest.fixture(scope="module")
def torch():
    """PyTorch, seeded (the test skips without it)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch


def torch_leaf(torch, a):
    """A float64 tensor of ``a`` that autograd differentiates."""
    return torch.tensor(np.ascontiguousarray(a), dtype=torch.float64, requires_grad=True)


def numpy_backends():
    """The backends that take NumPy arrays here: the reference and, once built, the CPU one."""
    names = ["reference"]
    try:
        from gradcells import _dispatch

        _dispatch.backend_module("cpu").lstm_cell  # noqa: B018 (imports the cell's CPU module)
    except ImportError:
        return names
    names.append("cpu")
    return names


NUMPY_BACKENDS = numpy_backends()


class StandInDevice:
    """A CUDA device as CuPy's context manager: entering it makes it the current device
    (``StandInDevice.current``), leaving it restores the one before."""

    current = 0

    def __init__(self, index):
        self.id = index

    def __enter__(self):
        self._before, StandInDevice.current = StandInDevice.current, self.id
        return self

    def __exit__(self, *exc):
        StandInDevice.current = self._before


def layer_norm_amplification(case):
    """The largest ``r = 1/sqrt(var + ε)`` of the rows a layer-norm case normalises (the
    three norms' rows at the valid steps; at most ``1/LN_MARGIN``): a layer norm multiplies
    the rounding of its row by it, so a float32 comparison's ulps term scales with it (one
    float32 reference run may round luckily where another order of operations does not)."""
    from gradcells.testing.cases import _normalised_rows

    variances = [rows.var(axis=-1) for rows in _normalised_rows(case)
                 if rows.size and rows.shape[-1] > 1]
    if not variances:
        return 1.0
    worst = np.max(1 / np.sqrt(np.concatenate(variances) + case["ln_epsilon"]))
    return max(1.0, float(worst))


_SUMMARY: list[str] = []


def pytest_runtest_logreport(report):
    """Collect the lines a test records as a ``summary`` property (``record_property``): they
    reach the controller from xdist's workers with the report."""
    if report.when == "call":
        _SUMMARY.extend(str(value) for name, value in report.user_properties
                        if name == "summary")


def pytest_terminal_summary(terminalreporter):
    """Print the collected ``summary`` lines (the fuzz's call count) at the end of the run."""
    for line in _SUMMARY:
        terminalreporter.write_line(line)
