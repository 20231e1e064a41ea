"""The documentation as the tests read it: its pages, their fenced blocks, headings and links.

The pages are README.md and docs/*.md. A fenced block's info string says what the tests do
with it (docs/README.md describes the convention):

- ``sh runnable`` (optionally ``exit=N``): a bash script that tests/integration/test_docs.py
  runs; a ``text output`` block right after it is what it prints.
- ``sh synopsis``: a command's usage; every flag it names must be in that command's --help.
- any other ``sh`` block is unmarked: it cannot run here (another host, a terminal, a real
  model provider, an install), and the test counts those per page.

Anchors are GitHub's: a heading's text, lower-cased, without punctuation other than ``-``
and ``_``, spaces made ``-``; a repeated one gets ``-1``, ``-2``...
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pages() -> list[Path]:
    """README.md and every page of docs/, in the order a reader meets them."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    info: tuple[str, ...]  # the info string's words: ("sh", "runnable", "exit=2")
    body: str
    output: str | None = None  # the ``text output`` block that follows a runnable one

    @property
    def lang(self) -> str:
        return self.info[0] if self.info else ""

    @property
    def runnable(self) -> bool:
        return self.lang == "sh" and "runnable" in self.info[1:]

    @property
    def synopsis(self) -> bool:
        return self.lang == "sh" and "synopsis" in self.info[1:]

    @property
    def exit_status(self) -> int:
        for word in self.info[1:]:
            if word.startswith("exit="):
                return int(word.removeprefix("exit="))
        return 0

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page, a ``text output`` block folded into the runnable block
    it follows (with only blank lines between them)."""
    found: list[Block] = []
    lines = path.read_text().split("\n")
    i = previous_end = 0
    while i < len(lines):
        m = re.match(r"^ *```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip(" "))
        start, info, body = i + 1, tuple(m.group(1).split()), []
        i += 1
        while i < len(lines) and not lines[i].lstrip(" ").startswith("```"):
            body.append(lines[i][indent:])
            i += 1
        i += 1
        block = Block(page_name(path), start, info, "\n".join(body) + "\n")
        if info == ("text", "output"):
            previous = found[-1] if found else None
            follows = previous is not None and previous.runnable and previous.output is None
            if not follows or any(line.strip() for line in lines[previous_end:start - 1]):
                raise ValueError(f"{block.id}: a text output block must follow a runnable block")
            found[-1] = replace(previous, output=block.body)
        else:
            found.append(block)
        previous_end = i
    return found


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings (outside fenced blocks)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(path):
        m = re.match(r"^(#{1,6}) (.*)$", line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
    return found


def links(path: Path) -> list[str]:
    """The targets of a page's inline Markdown links (outside fenced blocks and code spans)."""
    text = re.sub(r"`[^`]*`", "", "\n".join(_prose(path)))
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _prose(path: Path) -> list[str]:
    out, fence = [], False
    for line in path.read_text().split("\n"):
        if line.lstrip(" ").startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(line)
    return out
