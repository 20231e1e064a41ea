"""The order the workers of a parallel run take the tests in (tests/support/parallel.py):
grouped tests first, ``alone`` tests last, each kept in its order."""

from __future__ import annotations

import pytest

from tests.support.parallel import in_running_order


class _Item:
    def __init__(self, name: str, *marks: str) -> None:
        self.name = name
        self._marks = {m: getattr(pytest.mark, m).mark for m in marks}

    def get_closest_marker(self, name: str):
        return self._marks.get(name)


def test_groups_first_alone_last_each_in_its_order() -> None:
    items = [_Item("a"), _Item("b", "alone"), _Item("c", "xdist_group"), _Item("d"),
             _Item("e", "alone"), _Item("f", "xdist_group"), _Item("g")]
    in_running_order(items)
    assert [i.name for i in items] == ["c", "f", "a", "d", "g", "b", "e"]


def test_nothing_marked_keeps_the_order() -> None:
    items = [_Item(n) for n in "zyx"]
    in_running_order(items)
    assert [i.name for i in items] == ["z", "y", "x"]
