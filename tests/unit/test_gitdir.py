"""What a new .git may hold to be kept (landlock_helper.gitdir): a config of the keys git
clone writes, read exactly or refused, and git's sample hooks. The same on real clones,
with the attacks shown working against git itself: test_containment_clone."""

from __future__ import annotations

import os

import pytest

from landlock_helper.gitdir import ALLOWED, ALLOWED_IN_MODULE, Refused, check_config, refusal

CLONE = b"""[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
[submodule]
\tactive = .
[remote "origin"]
\turl = git@github.com:o/r.git
\ttagOpt = --no-tags
\tfetch = +refs/heads/*:refs/remotes/origin/*
\tpromisor = true
\tpartialclonefilter = blob:none
[extensions]
\tworktreeConfig = true
[branch "main"]
\tremote = origin
\tmerge = refs/heads/main
[submodule "sub"]
\turl = https://example.com/sub.git
"""


def test_what_git_clone_writes_passes():
    check_config(CLONE)
    check_config(b"# a comment\n; another\n\n[core]\n  bare=false\n")


@pytest.mark.parametrize("config", [
    b"[core]\n\tfsmonitor = touch /tmp/x\n",
    b"[core]\n\tFSMonitor = touch /tmp/x\n",
    b"[Core]\n\tfsmonitor\n",                                   # a key alone is "true"
    b"[core]\n\thooksPath = /tmp/h\n",
    b"[core]\n\tsshCommand = touch x\n",
    b"[core]\n\tpager = touch x\n",
    b"[core]\n\teditor = touch x\n",
    b"[core]\n\tworktree = /\n",                                # only a submodule's names one
    b"[alias]\n\tst = !touch x\n",
    b'[filter "x"]\n\tclean = touch x\n',
    b'[filter "lfs"]\n\tsmudge = touch x\n',
    b'[diff "x"]\n\ttextconv = touch x\n',
    b"[diff]\n\texternal = touch x\n",
    b'[merge "x"]\n\tdriver = touch x\n',
    b"[credential]\n\thelper = !touch x\n",
    b"[include]\n\tpath = /tmp/evil\n",
    b'[includeIf "gitdir:/"]\n\tpath = /tmp/evil\n',
    b'[remote "origin"]\n\tuploadpack = touch x\n',
    b'[remote "origin"]\n\tvcs = evil\n',
    b'[submodule "s"]\n\tupdate = !touch x\n',
    b"[gpg]\n\tprogram = touch x\n",
    b"[sequence]\n\teditor = touch x\n",
])
def test_every_key_that_names_a_program_is_refused(config):
    with pytest.raises(Refused, match="its config sets"):
        check_config(config)


@pytest.mark.parametrize("config", [
    b"[core] fsmonitor = touch x\n",                            # a key on the header's line
    b"[core]\n\tbare = false \\\n\n\tfsmonitor = x\n",          # a continuation line
    b'[core]\n\tbare = "false"\n',                              # quoting
    b"[core]\n\tbare = false # comment\n",                      # a comment after a value
    b"[core.x]\n\tbare = false\n",                              # the old [section.sub] form
    b'[remote  "o"]\n\turl = /x\n',                             # spacing git accepts and this does not
    b'[remote "o\\"]"]\n\turl = /x\n',                          # an escape in a subsection
    b"\xef\xbb\xbf[core]\n\tbare = false\n",                    # a byte-order mark
    b"[core]\r\n\tbare = false\r\n",
    b"[core]\n\tbare = false\x00\n",
    b"[core]\n\t\x0bbare = false\n",
    b"bare = false\n",                                          # a key before any section
    b"[core]\n\tbare = \xff\n",
])
def test_a_line_not_read_exactly_as_git_reads_it_is_refused(config):
    with pytest.raises(Refused):
        check_config(config)


@pytest.mark.parametrize("url", ["ext::sh -c touch% x", "evil::https://x", "evil://host/r", "-oProxyCommand=x",
                                 "fd::17"])
def test_a_url_naming_a_transport_helper_is_refused(url):
    with pytest.raises(Refused, match="transport helper"):
        check_config(f'[remote "origin"]\n\turl = {url}\n'.encode())


@pytest.mark.parametrize("url", ["/srv/r.git", "../r", "file:///srv/r.git", "https://h/r", "ssh://h/r", "h:r.git",
                                 "git@h:o/r.git", "git://h/r"])
def test_plain_urls_pass(url):
    check_config(f'[remote "origin"]\n\turl = {url}\n'.encode())


def test_a_submodule_git_directory_may_name_its_work_tree():
    config = b"[core]\n\tworktree = ../../../sub\n"
    check_config(config, {**ALLOWED, **ALLOWED_IN_MODULE})
    with pytest.raises(Refused):
        check_config(config)


def _gitdir(git, config: bytes = b"[core]\n\tbare = false\n"):
    (git / "hooks").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\n")
    (git / "config").write_bytes(config)
    return git


def _refusal(git):
    parent = os.open(git.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        st = os.stat(git, follow_symlinks=False)
        return refusal(parent, git.name, (st.st_dev, st.st_ino))
    finally:
        os.close(parent)


def test_a_git_made_directory_is_kept(tmp_path):
    assert _refusal(_gitdir(tmp_path / ".git")) is None


@pytest.mark.parametrize("plant, why", [
    (lambda g: (g / "hooks" / "post-checkout").write_text("x"), "it has a hook, hooks/post-checkout"),
    (lambda g: (g / "hooks" / "sub.sample").mkdir(), "it has a hook, hooks/sub.sample"),
    (lambda g: (g / "commondir").write_text("/elsewhere\n"), "commondir"),
    (lambda g: (g / "remotes").mkdir() or (g / "remotes" / "origin").write_text("URL: ext::x\n"), "remotes/"),
    (lambda g: os.link(g / "config", g.parent / "other-name"), "hard link"),
    (lambda g: (g / "config").unlink() or (g / "config").symlink_to(g.parent / "c"), "could not be opened"),
    (lambda g: (g / "config").unlink() or os.mkfifo(g / "config"), "not a regular file"),
    (lambda g: (g / "config").unlink(), "no config"),
    (lambda g: (g / "config.worktree").write_bytes(b"[core]\n\tfsmonitor = x\n"), "core.fsmonitor"),
    (lambda g: _gitdir(g / "modules" / "a" / "b", b"[alias]\n\tx = !y\n"), "alias.x"),
    (lambda g: (g / "modules").mkdir() or (g / "modules" / "m").symlink_to("/"), "symbolic link"),
])
def test_anything_git_would_run_is_refused(tmp_path, plant, why):
    git = _gitdir(tmp_path / ".git")
    (tmp_path / "c").write_text("[core]\n")
    plant(git)
    assert why in (_refusal(git) or "kept")


def test_a_directory_swapped_since_it_was_listed_is_refused(tmp_path):
    git = _gitdir(tmp_path / ".git")
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        st = os.stat(git)
        os.rename(git, tmp_path / "moved")
        _gitdir(tmp_path / ".git")
        assert refusal(parent, ".git", (st.st_dev, st.st_ino)) == "it changed while sluice looked at it"
    finally:
        os.close(parent)
