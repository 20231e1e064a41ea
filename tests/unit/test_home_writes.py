"""The hint after a write refused under the home directory (broker.cli.home_writes), fed
what real tools print: which directory it names, and when it says nothing."""

from __future__ import annotations

import pytest

from broker.cli.home_writes import WINDOW, HomeWrites

NPM = b"""npm error code EROFS
npm error syscall open
npm error path {home}/.npm/_cacache/tmp/abc
npm error errno -30
npm error rofs EROFS: read-only file system, open '{home}/.npm/_cacache/tmp/abc'
"""
PIP = b"ERROR: Could not install packages due to an OSError: [Errno 30] Read-only file system: '{home}/.local'\n"
CARGO = (b"error: failed to create directory `{home}/.cargo/registry/cache`\n\n"
         b"Caused by:\n  Read-only file system (os error 30)\n")
GO = b"go: creating work dir: mkdir {home}/.cache/go-build/00: read-only file system\n"
NYC = b"Error: EROFS: read-only file system, mkdir '{home}/.node-spawn-wrap-4242-a1b2c3'\n"


@pytest.fixture
def home(tmp_path):
    (tmp_path / ".npm").mkdir()
    return tmp_path


def watch_of(home, output: bytes, chunk: int = 7) -> HomeWrites:
    watch = HomeWrites(str(home))
    data = output.replace(b"{home}", str(home).encode())
    for i in range(0, len(data), chunk):  # in pieces, as a pipe hands them over
        watch.feed(data[i:i + chunk], 2)
    return watch


@pytest.mark.parametrize("output, allow", [(NPM, ".npm"), (PIP, ".local"), (CARGO, ".cargo"),
                                           (GO, ".cache/go-build")])
def test_the_tools_directory_is_named_with_the_flag_and_the_config_key(home, output, allow):
    hint = watch_of(home, output).hint()
    assert f"--writable {home}/{allow}" in hint
    assert f'writable_roots = ["~/{allow}"] in [sandbox_workspace_write]' in hint
    # A directory that is not there yet must be made first: --writable takes only what exists.
    assert ("mkdir -p" in hint) == (allow != ".npm")


def test_a_file_straight_in_the_home_directory_cannot_be_allowed_and_says_so(home):
    hint = watch_of(home, NYC).hint()
    assert f"could not write {home}/.node-spawn-wrap-4242-a1b2c3" in hint
    assert "cannot be made writable" in hint and "--writable DIR" in hint


def test_nothing_is_said_without_a_refusal_or_without_a_home_path(home, tmp_path_factory):
    assert watch_of(home, b"npm error code E404\nnpm error path " + str(home).encode() + b"/.npm/x\n").hint() is None
    assert watch_of(home, b"touch: cannot touch '/etc/x': Read-only file system\n").hint() is None
    other = tmp_path_factory.mktemp("other")
    # A path that merely starts like the home directory is not in it.
    assert watch_of(home, f"{home}x/file: Permission denied\n".encode()).hint() is None
    assert watch_of(other, NPM.replace(b"{home}", str(home).encode())).hint() is None


def test_a_refusal_and_a_path_further_apart_than_the_window_are_not_taken_together(home):
    far = b"EROFS\n" + b"x\n" * WINDOW + f"{home}/.npm/a\n".encode()
    assert watch_of(home, far).hint() is None
    near = b"EROFS\n" + b"x\n" * (WINDOW - 2) + f"{home}/.npm/a\n".encode()
    assert watch_of(home, near).hint() is not None


def test_streams_are_split_into_lines_each_on_its_own(home):
    watch = HomeWrites(str(home))
    watch.feed(f"{home}/.np".encode(), 1)
    watch.feed(b"EROFS unrelated\n", 2)  # stderr's line between the two halves of stdout's
    watch.feed(b"m/x\n", 1)
    assert f"--writable {home}/.npm" in watch.hint()


def test_the_last_line_counts_without_a_newline(home):
    assert watch_of(home, f"EROFS: read-only file system, open '{home}/.npm/x'".encode()).hint() is not None


def test_nodes_recursive_mkdir_counts_and_a_writable_root_is_not_the_sandboxs_doing(home):
    node = f"Error: ENOENT: no such file or directory, mkdir '{home}/.npm/_cacache'\n".encode()
    assert f"--writable {home}/.npm" in watch_of(home, node).hint()
    watch = HomeWrites(str(home), writable=[f"{home}/.npm"])
    watch.feed(NPM.replace(b"{home}", str(home).encode()))
    assert watch.hint() is None


def test_what_may_never_be_allowed_is_never_named(home, monkeypatch):
    monkeypatch.setenv("SLUICE_HOME", str(home / ".sluice"))
    for line in (f"cat: {home}/.sluice/config.toml: Permission denied\n",
                 f"error: could not lock config file {home}/proj/.git/config: Read-only file system\n"):
        assert watch_of(home, line.encode()).hint() is None, line
