"""The README's examples run as written, its links resolve, and it stays an introduction."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
# Relative Markdown links: [text](path) or [text](path#anchor); web links are not followed.
LINKS = [target for target in re.findall(r"\]\(([^)\s]+)\)", TEXT)
         if not re.match(r"[a-z]+://", target)]
MAX_LINES = 170


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub and MkDocs give the headings of a Markdown file."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        anchors.add(re.sub(r" +", "-", slug))
    return anchors


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


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


def test_readme_is_an_introduction():
    """Short, with no benchmark tables (they live in docs/performance.md) and no citation of
    a document the repository does not carry."""
    assert len(TEXT.splitlines()) <= MAX_LINES
    assert "median ms" not in TEXT and "vs BLAS bound" not in TEXT
    assert "docs/performance.md" in LINKS
    assert not re.search(r"\bSPEC \d", TEXT)


@pytest.mark.parametrize("target", LINKS)
def test_readme_link_resolves(target):
    path, _, anchor = target.partition("#")
    assert (ROOT / path).is_file(), f"README links to {path}, which does not exist"
    if anchor:
        assert anchor in heading_anchors(ROOT / path), f"{path} has no heading #{anchor}"
