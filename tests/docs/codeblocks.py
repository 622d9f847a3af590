"""The code blocks of README.md and of the documentation site (docs/**/*.md), and how each runs.

One collector for every test that runs documented code (the examples tests, the quick start
test, the tests of single examples): `blocks(page)` reads a page's fenced blocks in order,
with the fence's language and marks, the heading above it and its line.

The fence says what a block is (docs/getting-started.md, "How the examples run"):

- ```` ```python ```` runs as a program; ```` ```python title="copy.py" ```` is the file
  `copy.py`, written to the page's working directory (a later block runs it);
- ```` ```bash ```` runs as a script (`bash -euo pipefail`);
- ```` ```bash check="helm template" ```` needs a Kubernetes cluster: its `helm install` and
  `helm upgrade` commands are rendered offline with the same values and every manifest is
  validated against the Kubernetes schemas (tests/deploy/test_helm_chart.py); the block says
  so, as it says why;
- ```` ```text ```` is the output of the command above it, or a diagram: not code;
- any block with ```` no-run="why" ```` in its fence is not run, and says why (a fence
  with `no-run` and no reason is an error, as is a language none of the above).

mkdocs renders the marks as a plain block of the language (pymdownx.superfences with
`relaxed_headers`; `title` becomes the block's caption), and GitHub reads the first word.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNABLE = {"python": "python", "bash": "bash"}
NOT_CODE = {"text"}
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARK = re.compile(r'(?P<key>[A-Za-z][\w-]*)(?:="(?P<value>[^"]*)")?')
_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: `page` (relative to the repository), `line` (of its opening fence,
    1-based), `lang`, `marks` ({name: value}; a bare word maps to ""), `text` (the block's
    lines, indentation of the fence removed), `heading` (the nearest heading above)."""
    page: str
    line: int
    lang: str
    marks: dict
    text: str
    heading: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def no_run(self) -> str | None:
        """Why the block is not run (its `no-run` mark), or None when it runs."""
        return self.marks.get("no-run")

    @property
    def title(self) -> str | None:
        """The file name the block is (its `title` mark), or None."""
        return self.marks.get("title")

    @property
    def kind(self) -> str:
        """`python` or `bash` (runs), `file` (a python file a later block runs), `helm`
        (rendered offline), `no-run` (says why not), `text` (output or a diagram),
        `undeclared` (an error: `problems`)."""
        if self.no_run is not None:
            return "no-run"
        if self.lang == "bash" and self.marks.get("check") == "helm template":
            return "helm"
        if self.lang in NOT_CODE:
            return "text"
        if self.lang == "python" and self.title:
            return "file"
        return RUNNABLE.get(self.lang, "undeclared")

    @property
    def transactional(self) -> bool:
        """A block that writes in transactions: its run is checked for exactly-once across a
        crash (tests/docs/examples.py)."""
        return self.kind in ("python", "file") and \
            re.search(r"transactional[._]?id|transactionalId|writeStream", self.text) is not None


def problems(block: Block) -> list[str]:
    """What is wrong with how `block` declares itself (empty when it is fine)."""
    out = []
    if not block.lang:
        out.append("a fence without a language: say what the block is (python, bash, text)")
    elif block.no_run is not None:
        if not block.no_run.strip():
            out.append('no-run without a reason: write no-run="why it cannot run"')
    elif block.lang not in RUNNABLE and block.lang not in NOT_CODE:
        out.append(f"language {block.lang!r} is neither run nor text: mark it no-run=\"why\"")
    return out


def parse(text: str, page: str) -> list[Block]:
    """The fenced blocks of the Markdown `text` of `page`, in order."""
    out: list[Block] = []
    heading = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m is None:
            h = _HEADING.match(line)
            if h:
                heading = h.group(2)
            i += 1
            continue
        indent, fence, info = len(m.group("indent")), m.group("fence"), m.group("info").strip()
        close = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body, j = [], i + 1
        while j < len(lines) and not close.match(lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: fence never closed")
        lang, _, rest = info.partition(" ")
        marks = {mk.group("key"): mk.group("value") or "" for mk in _MARK.finditer(rest)}
        out.append(Block(page, i + 1, lang, marks, "\n".join(body) + "\n", heading))
        i = j + 1
    return out


def pages(root: pathlib.Path = ROOT) -> list[str]:
    """README.md and every page of the site, relative to `root`."""
    return ["README.md", *sorted(str(p.relative_to(root)) for p in (root / "docs").rglob("*.md"))]


def blocks(page: str, root: pathlib.Path = ROOT) -> list[Block]:
    """The blocks of `page` (a path relative to `root`)."""
    return parse((root / page).read_text(), page)


def section(page: str, heading: str, root: pathlib.Path = ROOT) -> list[Block]:
    """The blocks of `page` under the heading `heading` (and its subsections' headings are
    not counted: the nearest heading above each block)."""
    found = [b for b in blocks(page, root) if b.heading == heading]
    if not found:
        raise LookupError(f"{page} has no block under the heading {heading!r}")
    return found
