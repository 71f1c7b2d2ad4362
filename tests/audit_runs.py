"""Each framework's whole audit, run once per test process and shared by its tests.

``whole_audit(framework)`` is ``python -m gradcells audit FRAMEWORK --examples N`` (seed 0):
the tests of ``tests/test_audit*.py`` that read a framework's whole audit read this one run,
and each framework's whole audit is read by one file only, so that under
``pytest -n 2 --dist loadfile`` (a file to a worker) it still runs once. It is CI's only run
of the audits (``.ci/run`` has no ``audit all`` of its own): the file that owns a
framework's run asserts its exit status is 0, no unexpected mismatch, and its rows.
"""

from __future__ import annotations

import functools
import io

from gradcells import audit


@functools.cache
def whole_audit(framework: str, examples: int = 1) -> tuple[int, str]:
    """``(exit status, printed text)`` of every check of ``framework``'s audit at
    ``examples`` cases per check, seed 0, run once per process."""
    out = io.StringIO()
    status = audit.run(framework, examples=examples, stream=out, progress=False)
    return status, out.getvalue()
