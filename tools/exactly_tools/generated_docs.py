"""Regenerating the generated parts of a document (the README's tables, the design's
contents and module map): rewrite them, or with `check` only report drift."""
from __future__ import annotations

import pathlib
import sys
from typing import Callable


def regenerate(path: pathlib.Path, render: Callable[[str], str], check: bool, drift: str,
               summary: Callable[[str], str]) -> int:
    """Render `path`'s text. With `check`: exit status 1 and `drift` on stderr when the
    file differs from the rendering, else 0, writing nothing. Without: write the
    rendering when it differs, print `summary(new text)`, 0."""
    text = path.read_text()
    new = render(text)
    if check:
        if new != text:
            print(f"{path}: {drift}", file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new)
    print(f"{path}: {summary(new)}")
    return 0
