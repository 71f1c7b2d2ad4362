"""The README's examples run as written and its claims hold."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, capsys):
    for framework in ("torch", "tensorflow", "jax"):
        if f"import {framework}" in BLOCKS[index]:
            pytest.importorskip(framework)
    namespace = {}
    exec(compile(BLOCKS[index], f"README.md example {index + 1}", "exec"), namespace)
    if "report" in namespace:
        assert namespace["report"].passed
        assert namespace["g"].w.shape == (8, 20)
        assert "pass" in capsys.readouterr().out
