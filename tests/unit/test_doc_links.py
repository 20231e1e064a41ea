"""Every relative link of README.md and docs/*.md leads somewhere: to a file of the checkout,
and, when it names an anchor, to a heading of that page."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from tests.support.docs import ROOT, anchors, blocks, links, page_name, pages


def _relative(target: str) -> bool:
    return not target.startswith(("http://", "https://", "mailto:"))


@pytest.mark.parametrize("page", pages(), ids=page_name)
def test_every_relative_link_and_anchor_resolves(page) -> None:
    dangling = []
    for target in filter(_relative, links(page)):
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists() or not dest.is_relative_to(ROOT):
            dangling.append(f"{target}: no file {dest}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            dangling.append(f"{target}: no heading #{anchor} in {page_name(dest)}")
    assert not dangling, f"{page_name(page)}: " + "; ".join(dangling)


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    """A page a reader cannot find from the front door is a page nobody reads."""
    readme = pages()[0]
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in links(readme) if _relative(t)}
    unlinked = [page_name(p) for p in pages()[1:] if p.resolve() not in linked]
    assert not unlinked, f"not linked from README.md: {unlinked}"


def test_the_checker_finds_a_dangling_anchor(tmp_path) -> None:
    """The link check above cannot pass vacuously: a heading's anchor is found, a wrong one
    is not, and a link inside a fenced block or a code span is no link."""
    page = tmp_path / "page.md"
    page.write_text("# A `title`: here\n\n## Twice\n\n## Twice\n\nSee [x](#a-title-here) and `[y](#z)`.\n\n"
                    "```sh\n[z](#nowhere)\n```\n")
    assert anchors(page) == {"a-title-here", "twice", "twice-1"}
    assert links(page) == ["#a-title-here"]
    assert blocks(page)[0].lang == "sh"


def test_an_output_block_belongs_to_the_runnable_block_just_before_it(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh runnable exit=3\necho hi; exit 3\n```\n\n```text output\nhi\n```\n\n"
                    "- indented:\n\n  ```sh synopsis\n  sluice run [--network]\n  ```\n")
    (run, synopsis) = blocks(page)
    assert (run.exit_status, run.body, run.output) == (3, "echo hi; exit 3\n", "hi\n")
    assert synopsis.synopsis and synopsis.body == "sluice run [--network]\n"
    page.write_text("```sh runnable\necho hi\n```\n\nIt prints:\n\n```text output\nhi\n```\n")
    with pytest.raises(ValueError, match="must follow a runnable block"):
        blocks(page)
