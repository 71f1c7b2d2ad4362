"""The one text table and the one progress line: the oracle's report, ``python -m gradcells
check`` and the audit all print through these.

A table is left-aligned columns two spaces apart with a rule of dashes under the header and
no trailing blanks. A progress line goes to a stream (stderr): on a terminal it is rewritten
in place and cleared at the end; elsewhere (a log, a pipe) one line is written per new label.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TextIO


def table(header: Sequence[str], rows: Iterable[Sequence[str]], *,
          free_last: bool = False) -> list[str]:
    """The lines of a text table of ``rows`` (strings) under ``header``.

    ``free_last``: the last column (a free-text detail) is not padded and does not widen the
    rule, whose dashes under it are as wide as its header.
    """
    cells = [tuple(header)] + [tuple(r) for r in rows]
    measured = len(header) - 1 if free_last else len(header)
    widths = [max(len(c[k]) for c in cells) for k in range(measured)]
    if free_last:
        widths.append(len(header[-1]))
    lines = ["  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


class Progress:
    """``[k/total] label`` on ``stream`` (default ``sys.stderr``), one ``step`` at a time.

    On a terminal the line is rewritten in place and ``close`` clears it; otherwise a line is
    written whenever the label changes. ``enabled=False`` writes nothing.
    """

    def __init__(self, total: int, *, prefix: str = "", stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.total, self.prefix, self.enabled = total, prefix, enabled
        self.stream = sys.stderr if stream is None else stream
        self.tty = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.count, self.width = 0, 0
        self.label: str | None = None

    def step(self, label: str) -> None:
        """Count one step of ``label``."""
        self.count += 1
        if not self.enabled:
            return
        text = f"{self.prefix}[{self.count}/{self.total}] {label}"
        if self.tty:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = max(self.width, len(text))
        elif label != self.label:
            self.stream.write(text + "\n")
        self.label = label
        self.stream.flush()

    def close(self) -> None:
        """Clear the line on a terminal."""
        if self.tty and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()


def count(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and the noun, singular or plural: ``count(1, "check")`` is ``"1 check"``."""
    return f"{n} {singular if n == 1 else plural or singular + 's'}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """The lines of a Markdown (GitHub) table of ``rows`` under ``header``, columns padded to
    one width so that it reads as a table in a terminal too; a ``|`` in a cell is escaped."""
    cells = [[str(c).replace("|", "\\|") for c in row] for row in [header, *rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    lines = ["| " + " | ".join(c.ljust(w)
                               for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    return [lines[0], rule, *lines[1:]]
