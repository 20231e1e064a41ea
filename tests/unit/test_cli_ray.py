"""`sluice ray` and `--ray` on the command line, without a cluster: mistakes and a
missing extra are one line and a non-zero exit."""

import sys

import pytest

from broker.cli.main import main


@pytest.fixture
def no_ray(monkeypatch):
    """This process as if the ray extra were not installed (even where an earlier test of
    this worker has used it: the package goes too, or ``from broker.ray import cluster``
    would find the module it imported then as the package's attribute)."""
    monkeypatch.setitem(sys.modules, "ray", None)
    gone = [m for m in sys.modules if (m == "broker.ray" or m.startswith("broker.ray.")) and m != "broker.ray.scaling"]
    for name in gone:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("argv", [["ray", "up"], ["ray", "status"], ["ray", "down"],
                                  ["run", "--ray", "--", "true"]])
def test_without_the_extra_each_says_so_in_one_line(no_ray, capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'sluice[ray]'" in err


@pytest.mark.parametrize("argv, wrong", [
    (["ray", "up", "--slots-per-cpu", "0"], "--slots-per-cpu"),
    (["ray", "up", "--scale-after", "soon"], "--scale-after"),
    (["ray", "up", "--min-executors", "3", "--max-executors", "2"], "--min-executors"),
    (["ray"], "{up,status,down}"),
    (["run", "--ray", "--connect", "tcp://127.0.0.1:1", "--", "true"], "--ray and --connect"),
])
def test_mistakes_are_one_line(capsys, argv, wrong):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any(wrong in line for line in err), err
