"""How a parallel run hands out the tests (tests/support/parallel.py): the order the
workers take them in, and which tests go to a worker together."""

from __future__ import annotations

import json

import pytest

from tests.support.parallel import ModuleScheduling, in_running_order, read_alone


class _Item:
    def __init__(self, name: str, *marks: str) -> None:
        self.name = name
        self._marks = {m: getattr(pytest.mark, m).mark for m in marks}

    def get_closest_marker(self, name: str):
        return self._marks.get(name)


def test_ray_first_alone_last_each_in_its_order() -> None:
    items = [_Item("a"), _Item("b", "alone"), _Item("c", "ray"), _Item("d"),
             _Item("e", "alone"), _Item("f", "ray"), _Item("g")]
    in_running_order(items)
    assert [i.name for i in items] == ["c", "f", "a", "d", "g", "b", "e"]


def test_nothing_marked_keeps_the_order() -> None:
    items = [_Item(n) for n in "zyx"]
    in_running_order(items)
    assert [i.name for i in items] == ["z", "y", "x"]


def _scheduling(alone_file) -> ModuleScheduling:
    sched = object.__new__(ModuleScheduling)  # only the scope rule is under test
    sched.alone = read_alone(str(alone_file))
    return sched


def test_a_module_goes_whole_and_an_alone_test_by_itself(tmp_path) -> None:
    (tmp_path / "alone.json").write_text(json.dumps(["tests/integration/test_b.py::test_quick[x]"]))
    sched = _scheduling(tmp_path / "alone.json")
    assert sched._split_scope("tests/integration/test_b.py::test_one") == "tests/integration/test_b.py"
    assert sched._split_scope("tests/integration/test_b.py::Class::test_two[1]") == "tests/integration/test_b.py"
    assert sched._split_scope("tests/integration/test_b.py::test_quick[x]") == "tests/integration/test_b.py::test_quick[x]"


def test_without_the_workers_list_every_test_goes_with_its_module(tmp_path) -> None:
    sched = _scheduling(tmp_path / "missing.json")
    assert sched._split_scope("tests/unit/test_a.py::test_x") == "tests/unit/test_a.py"
