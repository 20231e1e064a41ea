"""A fresh clone keeps its .git; a planted one is moved aside before the user's git runs it.

After a command, a new ``.git`` in the workspace or in one of its direct subdirectories
is kept when git itself made it (``git clone``, ``git init``) and moved aside when it
holds something git would run with the user's rights (landlock_helper.gitdir). Each
planted variant is first shown working where it should (unsandboxed, on a copy: the
user's git runs the planted program), then contained. Real git, real sandbox, as root
and as an unprivileged user.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support.harness import reap
from tests.support.sandbox_harness import sandbox, start_sandbox

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

BLOCKED = ".git.sluice-blocked-"
EVIL_CFG = "printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch {m}\\n' > {to}"
HOOK = "printf '#!/bin/sh\\ntouch {m}\\n' > {to} && chmod +x {to}"
COMMIT = "git commit -q --allow-empty -m x"
CONFLICT = ("git checkout -qb other && echo b > f && git commit -qam b && git checkout -q main && "
            "echo a > f && git commit -qam a && git merge -q other")


class Plant:
    """``plant`` runs in the fresh clone (``ws/clone``), ``later`` in the workspace by a
    second command (what a later command could do through what the first left), and
    ``trigger`` is what the user then runs in the clone, unsandboxed."""

    def __init__(self, plant: str, trigger: str, later: str = "", where: str = "clone") -> None:
        self.plant, self.trigger, self.later, self.where = plant, trigger, later, where


PLANTS = {
    "fsmonitor": Plant("git config core.fsmonitor 'touch {m}'", "git status"),
    "hook": Plant(HOOK.format(m="{m}", to=".git/hooks/pre-commit"), COMMIT),
    "hooks-path": Plant("mkdir ../h && " + HOOK.format(m="{m}", to="../h/pre-commit")
                        + ' && git config core.hooksPath "$(cd ../h && pwd)"', COMMIT),
    "hooks-symlink": Plant("mkdir ../h && " + HOOK.format(m="{m}", to="../h/pre-commit")
                           + ' && rm -r .git/hooks && ln -s "$(cd ../h && pwd)" .git/hooks', COMMIT),
    "ssh-command": Plant("git config core.sshCommand 'touch {m}; false'",
                         "git ls-remote ssh://example.invalid/r"),
    "alias": Plant("git config alias.st '!touch {m}'", "git st"),
    "filter": Plant("git config filter.x.clean 'touch {m}; cat' && echo '* filter=x' > .git/info/attributes",
                    "echo change >> f && git add f"),
    "diff-driver": Plant("git config diff.x.command 'touch {m}; true' && echo '* diff=x' > .git/info/attributes",
                         "echo change >> f && git diff"),
    "merge-driver": Plant("git config merge.x.driver 'touch {m}; false' && echo '* merge=x' > .git/info/attributes",
                          CONFLICT),
    "credential-helper": Plant("git config credential.helper '!touch {m}; true'",
                               "printf 'protocol=https\\nhost=example.invalid\\n\\n' | git credential fill"),
    "include": Plant(EVIL_CFG.format(m="{m}", to="../evil.cfg")
                     + ' && git config include.path "$(cd .. && pwd)/evil.cfg"', "git status"),
    "include-if": Plant(EVIL_CFG.format(m="{m}", to="../evil.cfg")
                        + ' && git config includeIf.gitdir:/.path "$(cd .. && pwd)/evil.cfg"', "git status"),
    "pager": Plant("git config core.pager 'touch {m}; cat'", 'script -qec "git -p log --oneline" /dev/null'),
    "editor": Plant("git config core.editor 'touch {m}; true'", "git commit -q --allow-empty"),
    "upload-pack": Plant("git config remote.origin.uploadpack 'touch {m}; false'", "git fetch -q origin"),
    "commondir": Plant('cp -r .git ../elsewhere && git config -f ../elsewhere/config core.fsmonitor "touch {m}" && '
                       'echo "$(cd .. && pwd)/elsewhere" > .git/commondir', "git status"),
    "config-symlink": Plant(EVIL_CFG.format(m="{m}", to="../evil.cfg")
                            + ' && ln -sf "$(cd .. && pwd)/evil.cfg" .git/config', "git status"),
    # Clean when the first command ends; the second writes through the other name.
    "config-hard-link": Plant("ln .git/config ../cfg", "git status",
                              later="printf '[core]\\n\\tfsmonitor = touch {m}\\n' >> cfg"),
    # A submodule's git directory, which git uses in the submodule's work tree.
    "module-config": Plant('cp -r .git ../m.git && mkdir -p .git/modules && mv ../m.git .git/modules/m && '
                           'rm -rf .git/modules/m/modules && '
                           'git config -f .git/modules/m/config core.fsmonitor "touch {m}" && '
                           'git config -f .git/modules/m/config core.worktree ../../../m && '
                           'mkdir m && echo "gitdir: ../.git/modules/m" > m/.git', "cd m && git status"),
    "workspace-root": Plant("git init -q . && git config core.fsmonitor 'touch {m}'", "git status", where="."),
}


GITCONFIG = "[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n[protocol \"file\"]\n\tallow = always\n"


def _git_env(home, ws) -> dict[str, str]:
    """git as a user runs it, minus this machine's own git configuration, and willing to
    work in a repository another user (nobody) owns, as the user's git would if told to.
    (Its global config lies in the workspace: the sandbox shows the host's /tmp only there.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") and k not in ("EDITOR", "VISUAL", "PAGER")}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=f"{ws}/gitconfig", GIT_TERMINAL_PROMPT="0",
               GIT_AUTHOR_NAME="n", GIT_AUTHOR_EMAIL="n@example.invalid", GIT_COMMITTER_NAME="n",
               GIT_COMMITTER_EMAIL="n@example.invalid")
    return env


def _git(args, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=True)


@pytest.fixture
def ws(open_tmp, tmp_path):
    """A workspace without a .git, holding a bare upstream (with a submodule) to clone."""
    ws = open_tmp / "ws"
    ws.mkdir()
    (ws / "gitconfig").write_text(GITCONFIG)
    env = _git_env(tmp_path, ws)
    for name, files in (("sub-upstream", {"g": "g\n"}), ("upstream", {"f": "f\n"})):
        src = tmp_path / f"{name}-src"
        src.mkdir()
        _git(["init", "-q"], src, env)
        for fname, text in files.items():
            (src / fname).write_text(text)
        if name == "upstream":
            _git(["submodule", "add", "-q", f"file://{ws}/sub-upstream.git", "sub"], src, env)
        _git(["add", "-A"], src, env)
        _git(["commit", "-qm", "one"], src, env)
        _git(["clone", "-q", "--bare", str(src), str(ws / f"{name}.git")], tmp_path, env)
    for d, dirs, files in os.walk(ws):
        os.chmod(d, 0o777 if d == str(ws) else 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    return ws


def _in_sandbox(script: str, ws, as_user, nobody_env, tmp_path) -> subprocess.CompletedProcess:
    env = _git_env("/nonexistent" if as_user == "nobody" else tmp_path, ws)
    return sandbox(script, cwd=ws, user=as_user, nobody=nobody_env, env=env, timeout=120)


def _blocked(ws) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), ws) for d, dirs, _ in os.walk(ws) for n in dirs
                  if n.startswith(BLOCKED))


def test_a_fresh_clone_and_git_init_keep_their_git(as_user, nobody_env, ws, tmp_path):
    r = _in_sandbox(f"git clone -q --recurse-submodules file://{ws}/upstream.git clone && "
                    "git clone -q --sparse --filter=blob:none --depth=1 --no-tags "
                    f"file://{ws}/upstream.git sparse && git init -q . && git -C clone log --oneline && echo done",
                    ws, as_user, nobody_env, tmp_path)
    assert r.stdout.endswith("one\ndone\n"), r.stderr
    assert "sluice:" not in r.stderr and _blocked(ws) == [], r.stderr
    env = _git_env(tmp_path, ws)
    for repo in ("clone", "clone/sub", "sparse"):
        assert _git(["status", "--porcelain"], ws / repo, env).stdout == ""
    assert (ws / ".git" / "HEAD").is_file()
    # Kept, it is a repository like the workspace's own: read-only to the next command.
    r = _in_sandbox("touch clone/.git/hooks/pre-commit; echo $?; git -C clone commit -q --allow-empty -m x; echo $?",
                    ws, as_user, nobody_env, tmp_path)
    touched, committed = r.stdout.split()
    assert touched != "0" and committed != "0", r.stderr
    assert not (ws / "clone" / ".git" / "hooks" / "pre-commit").exists()


@pytest.mark.parametrize("variant", sorted(PLANTS))
def test_a_planted_git_is_moved_aside_before_git_runs_it(variant, as_user, nobody_env, ws, tmp_path):
    plant = PLANTS[variant]
    if plant.trigger.startswith("script ") and shutil.which("script") is None:
        pytest.skip("needs script(1) to give git a terminal for its pager")
    marker = tmp_path / "ran"
    clone = f"git clone -q file://{ws}/upstream.git clone && "
    first = clone + f"cd {plant.where} && " + plant.plant.format(m=marker)
    later = plant.later.format(m=marker)
    trigger = plant.trigger.format(m=marker)
    env = _git_env(tmp_path, ws)
    # Where it should, it works: the same commands unsandboxed, on a copy of the workspace.
    copy = tmp_path / "copy"
    shutil.copytree(ws, copy, symlinks=True)
    for script in (first, later):
        subprocess.run(["sh", "-ec", script], cwd=copy, env=env, check=True, capture_output=True, timeout=60)
    subprocess.run(["sh", "-c", trigger], cwd=copy / plant.where, env=env, capture_output=True, timeout=60)
    assert marker.exists(), f"the {variant} attack does not work unsandboxed, so this test proves nothing"
    marker.unlink()
    # Sandboxed: the first command plants, a later one may write through what it left.
    r = _in_sandbox(f"{first} && echo planted", ws, as_user, nobody_env, tmp_path)
    assert "planted" in r.stdout, r.stderr
    blocked = _blocked(ws)
    assert len(blocked) == 1 and os.path.dirname(blocked[0]) == plant.where.strip("."), (blocked, r.stderr)
    assert "which is not a repository as git makes it" in r.stderr, r.stderr
    assert f"moved it to {ws}/{blocked[0]}" in r.stderr, r.stderr
    if later:
        r = _in_sandbox(later, ws, as_user, nobody_env, tmp_path)
        assert r.returncode == 0, r.stderr
    subprocess.run(["sh", "-c", trigger], cwd=ws / plant.where, capture_output=True, timeout=60,
                   env=dict(env, GIT_CEILING_DIRECTORIES=str(ws.parent)))
    assert not marker.exists()


def test_a_kept_clone_changed_by_a_command_already_running_is_checked_again(as_user, nobody_env, ws, tmp_path):
    """A command started before the clone was checked has no read-only cover over it: what
    it plants there is found when it ends (the clone is not in what it started with)."""
    marker = tmp_path / "ran"
    running = start_sandbox(f"echo started && read go && cd clone && git config core.fsmonitor 'touch {marker}' "
                            "&& echo planted", cwd=ws, user=as_user, nobody=nobody_env, stderr=subprocess.PIPE,
                            env=_git_env("/nonexistent" if as_user == "nobody" else tmp_path, ws))
    try:
        # Its sandbox is made (its view fixed) before the clone exists.
        assert running.stdout.readline() == "started\n"
        r = _in_sandbox(f"git clone -q file://{ws}/upstream.git clone && echo cloned", ws, as_user, nobody_env,
                        tmp_path)
        assert "cloned" in r.stdout and _blocked(ws) == [], r.stderr
        out, err = running.communicate("go\n", timeout=60)
    finally:
        reap(running)
    assert "planted" in out, err
    blocked = _blocked(ws)
    assert len(blocked) == 1 and f"fsmonitor = touch {marker}" in (ws / blocked[0] / "config").read_text(), blocked
    assert "its config sets core.fsmonitor" in err
    subprocess.run(["git", "status"], cwd=ws / "clone", capture_output=True, timeout=60,
                   env=dict(_git_env(tmp_path, ws), GIT_CEILING_DIRECTORIES=str(ws.parent)))
    assert not marker.exists()
