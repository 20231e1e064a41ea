"""How a parallel run hands out the tests (tests/support/parallel.py): the order the
workers take them in, and which tests go to a worker together."""

from __future__ import annotations

import json
import os
import types

import pytest

from tests.support.harness import ROOT
from tests.support.parallel import (
    SECONDS_FILE,
    ModuleScheduling,
    SecondsRecorder,
    in_running_order,
    read_alone,
    read_seconds,
)


class _Item:
    def __init__(self, name: str, *marks: str, module: str = "tests/test_m.py") -> None:
        self.name = name
        self.nodeid = f"{module}::{name}"
        self._marks = {m: getattr(pytest.mark, m).mark for m in marks}

    def get_closest_marker(self, name: str):
        return self._marks.get(name)


def test_ray_first_alone_last_each_in_its_order() -> None:
    items = [_Item("a"), _Item("b", "alone"), _Item("c", "ray"), _Item("d"),
             _Item("e", "alone"), _Item("f", "ray"), _Item("g")]
    in_running_order(items, {})
    assert [i.name for i in items] == ["c", "f", "a", "d", "g", "b", "e"]


def test_nothing_marked_and_no_seconds_keeps_the_order() -> None:
    items = [_Item(n) for n in "zyx"]
    in_running_order(items, {})
    assert [i.name for i in items] == ["z", "y", "x"]


def test_modules_go_longest_first_whole_and_unknown_ones_after_in_their_order() -> None:
    items = [_Item("a1", module="a.py"), _Item("a2", module="a.py"), _Item("b1", module="b.py"),
             _Item("c1", module="c.py"), _Item("c2", "alone", module="c.py"), _Item("c3", module="c.py"),
             _Item("d1", module="d.py"), _Item("e1", module="e.py"), _Item("r1", "ray", module="r.py")]
    in_running_order(items, {"c.py": 70.0, "a.py": 3.5, "e.py": 12.0, "r.py": 1.0})
    assert [i.name for i in items] == ["r1", "c1", "c3", "e1", "a1", "a2", "b1", "d1", "c2"]


def test_the_seconds_file_is_read_leniently(tmp_path) -> None:
    path = tmp_path / "seconds.json"
    assert read_seconds(str(path)) == {}
    path.write_text("[1, 2]")
    assert read_seconds(str(path)) == {}
    path.write_text("{not json")
    assert read_seconds(str(path)) == {}
    path.write_text(json.dumps({"a.py": 2, "b.py": "x", "c.py": True, "d.py": 0.5}))
    assert read_seconds(str(path)) == {"a.py": 2.0, "d.py": 0.5}


def test_the_seconds_kept_name_modules_that_exist() -> None:
    """The file in the repository names test modules of this suite (a renamed module
    loses its place, not its tests)."""
    seconds = read_seconds(SECONDS_FILE)
    assert len(seconds) > 50
    missing = [m for m in seconds if not os.path.isfile(os.path.join(ROOT, m))]
    assert not missing, f"in {SECONDS_FILE} but not in the suite: {missing} (refresh it: --record-module-seconds)"


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


def test_the_recorder_sums_each_modules_phases_and_leaves_alone_tests_out(tmp_path) -> None:
    path = tmp_path / "seconds.json"
    recorder = SecondsRecorder(str(path))
    for nodeid, duration, keywords in [("a.py::t1", 0.25, {}), ("a.py::t1", 1.0, {}), ("a.py::t2[x]", 2.0, {}),
                                       ("b.py::T::t", 0.5, {}), ("a.py::slow", 30.0, {"alone": 1})]:
        recorder.pytest_runtest_logreport(types.SimpleNamespace(nodeid=nodeid, duration=duration, keywords=keywords))
    recorder.pytest_sessionfinish()
    assert read_seconds(str(path)) == {"a.py": 3.2, "b.py": 0.5}
