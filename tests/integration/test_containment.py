"""Attacks on the sandbox's filesystem view, each tried the way a hostile command would.

The threat: a command (and the model that wrote it) that wants to change what it was not
given, or reach what controls anything. What must hold:

- Outside the writable roots nothing changes: content, mode, owner, times, xattrs,
  links, renames, special files (the view outside the roots is a read-only mount).
- The host's /tmp (other programs' sockets, ticket caches, other repositories, other
  sluice daemons' runtime dirs) is not visible; sluice's own /tmp is.
- The user's runtime dir and paths the caller hides are hidden, also when they were
  made after the sandbox was warmed.
- No other terminal of the user is visible; the command's own pseudo-terminals work.
- The command's directory and roots are resolved once, on the trusted side; a directory
  swapped for a symlink or another directory before the command starts is refused, and
  / or the home directory are never writable roots.
- The workspace keeps its shape: it cannot be renamed or removed, its ``.git``/``.sluice``
  (and those of repositories directly below it, and what a ``.git`` link points to) stay
  read-only, and a ``.git`` the command creates or swaps in is moved aside before the
  user's next git command could run it.

Each attack runs as root and, where the outcome could differ, as the unprivileged
``nobody``. Socket and setuid attacks live in test_containment_sockets.py, the agent's
``workdir`` in test_containment_workdir.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from landlock_helper import SandboxPolicy, mounts
from landlock_helper.spawn import SandboxError, Spawner, _check, _encode_spec, _make_warm, _Template
from tests.support.harness import reap, sluice_argv
from tests.support.sandbox_harness import INNER_PYTHON, sandbox

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
              pytest.mark.timeout(60)]


def _snapshot(path: str) -> tuple:
    st = os.lstat(path)
    xattrs = tuple(sorted(os.listxattr(path, follow_symlinks=False)))
    with open(path, "rb") as f:
        content = f.read()
    return (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_nlink, xattrs, content)


# --- nothing outside the writable roots changes -----------------------------------------


def _inner_python(as_user: str) -> str:
    """A Python the command itself can run (root's may live under a private /root)."""
    if os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    if as_user != "root":
        pytest.skip("no Python an unprivileged command can run")
    return INNER_PYTHON


def _metadata_attacks(where: str, python: str) -> str:
    victim = f"{where}/victim"
    attacks = {
        "xattr": f"{python} -c \"import os; os.setxattr('{victim}', 'user.planted', b'1')\"",
        "times": f"touch -d 2001-01-01 {victim}",
        "owner": f"chown $(id -u):$(id -g) {victim}",
        "setuid": f"chmod 4777 {victim}",
        "hardlink": f"ln {victim} {where}/linked",
        "fifo": f"mkfifo {where}/fifo",
        "symlink": f"ln -s /etc/passwd {where}/sym",
        "truncate": f"truncate -s 0 {victim}",
        "append": f"echo pwned >> {victim}",
        "chmod": f"chmod 000 {victim}",
        "rename": f"mv {victim} {where}/renamed",
    }
    # Ordered so that, unsandboxed, each one still works after the ones before it.
    return "; ".join(f"{cmd} 2>/dev/null && echo {name}=changed || echo {name}=refused"
                     for name, cmd in attacks.items())


def test_metadata_outside_the_roots_cannot_change(as_user, nobody_env, workdir, outside, tmp_path):
    python = _inner_python(as_user)
    owner = 0 if as_user == "root" else 65534
    control = tempfile.mkdtemp(prefix="sl-control-", dir="/var/tmp")
    try:
        shutil.copy(os.path.join(outside, "victim"), os.path.join(control, "victim"))
        for d in (outside, control):
            os.chown(d, owner, owner)
            os.chown(os.path.join(d, "victim"), owner, owner)
            os.chmod(os.path.join(d, "victim"), 0o644)
        # Without the sandbox every one of these attacks works for this user.
        plain = ["sh", "-c", _metadata_attacks(control, python)]
        if as_user != "root":
            plain = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *plain]
        unsandboxed = subprocess.run(plain, capture_output=True, text=True, timeout=30)
        assert "=refused" not in unsandboxed.stdout, unsandboxed.stdout
        victim = os.path.join(outside, "victim")
        before = _snapshot(victim)
        listing = sorted(os.listdir(outside))
        r = sandbox(_metadata_attacks(outside, python), cwd=workdir, user=as_user, nobody=nobody_env)
        assert "=changed" not in r.stdout and r.stdout.count("=refused") == 11, r.stdout + r.stderr
        assert _snapshot(victim) == before
        assert sorted(os.listdir(outside)) == listing
    finally:
        shutil.rmtree(control)


def test_read_only_mode_changes_nothing_even_in_its_directory(as_user, nobody_env, workdir):
    target = workdir / "file"
    target.write_text("original\n")
    os.chmod(target, 0o666)
    before = _snapshot(str(target))
    r = sandbox("chmod 600 file; touch -d 2001-01-01 file; mv file moved; echo x > file; echo done",
                cwd=workdir, flags=["--sandbox", "read-only"], user=as_user, nobody=nobody_env)
    assert r.stdout.strip() == "done", r.stderr
    assert _snapshot(str(target)) == before
    assert not (workdir / "moved").exists()


# --- what is visible --------------------------------------------------------------------


@contextlib.contextmanager
def _dir_with_secret(under: str, prefix: str, name: str, text: str):
    """A directory in ``under`` that anyone may read, holding one readable secret file."""
    path = tempfile.mkdtemp(prefix=prefix, dir=under)
    try:
        os.chmod(path, 0o755)
        pathlib.Path(path, name).write_text(text)
        os.chmod(os.path.join(path, name), 0o644)
        yield path
    finally:
        shutil.rmtree(path)


def test_host_tmp_is_not_visible_and_tmp_is_sluices_own(as_user, nobody_env, workdir):
    with _dir_with_secret("/tmp", "sl-host-", "ticket", "krb5 secret\n") as host:
        name = os.path.basename(host)
        r = sandbox(f"cat {host}/ticket; ls /tmp | grep -c {name}; echo mine > /tmp/sl-own-$$ && echo wrote",
                    cwd=workdir, user=as_user, nobody=nobody_env)
        assert "krb5 secret" not in r.stdout
        assert r.stdout.split() == ["0", "wrote"], r.stderr
        assert "No such file or directory" in r.stderr
        # What the command wrote to /tmp is in sluice's /tmp, never the host's.
        assert not [n for n in os.listdir("/tmp") if n.startswith("sl-own-")]
        scratch = mounts.scratch_dir(0 if as_user == "root" else 65534)
        own = [n for n in os.listdir(scratch) if n.startswith("sl-own-")]
        assert own
        for n in own:
            os.unlink(os.path.join(scratch, n))


def test_tmp_persists_between_commands_of_one_user(workdir):
    marker = f"sl-persist-{os.getpid()}"
    try:
        sandbox(f"echo kept > /tmp/{marker}", cwd=workdir)
        r = sandbox(f"cat /tmp/{marker}", cwd=workdir)
        assert r.stdout == "kept\n", r.stderr
    finally:
        sandbox(f"rm -f /tmp/{marker}", cwd=workdir)


def test_user_runtime_dir_is_hidden(as_user, nobody_env, workdir):
    with _dir_with_secret("/var/tmp", "sl-xdg-", "bus-token", "s3cret\n") as xdg:
        env = dict(os.environ, XDG_RUNTIME_DIR=xdg)
        r = sandbox(f"ls -A {xdg}; cat {xdg}/bus-token; echo end", cwd=workdir, env=env,
                    user=as_user, nobody=nobody_env)
        assert "s3cret" not in r.stdout and "bus-token" not in r.stdout
        assert r.stdout.strip().endswith("end")


def test_hidden_path_made_after_the_sandbox_was_warmed_is_hidden(workdir):
    base = tempfile.mkdtemp(prefix="sl-late-", dir="/var/tmp")
    late = os.path.join(base, "runtime")
    spawner = Spawner([late], pool=2)
    try:
        spawner.refill(block=True)  # warm sandboxes exist before the directory does
        os.mkdir(late, 0o755)
        pathlib.Path(late, "token").write_text("s3cret")
        r, w = os.pipe()
        policy = SandboxPolicy.from_mode("workspace-write")
        proc = spawner.spawn(["sh", "-c", f"cat {late}/token; ls -A {late}; echo end"], cwd=str(workdir),
                             env={"PATH": os.environ["PATH"]}, policy=policy, stdout=w, stderr=w)
        os.close(w)
        out = b""
        while chunk := os.read(r, 65536):
            out += chunk
        os.close(r)
        assert proc.wait(30) is not None
        proc.close()
        assert b"s3cret" not in out and b"token" not in out.replace(b"/token", b"")
        assert out.strip().endswith(b"end")
    finally:
        spawner.close()
        shutil.rmtree(base)


def test_other_terminals_are_invisible_own_pty_works(as_user, nobody_env, workdir):
    master, slave = os.openpty()
    try:
        other = os.ttyname(slave)
        os.chmod(other, 0o666)  # even a terminal anyone may open stays out of reach
        python = _inner_python(as_user)
        r = sandbox(f"ls /dev/pts; (echo typed > {other}) 2>/dev/null; echo write=$?; head -c1 {other}; echo read=$?; "
                    f"{python} -c 'import os, pty; m, s = pty.openpty(); os.write(s, b\"ok\\n\"); "
                    f"print(\"own\", os.read(m, 16).decode().strip(), os.ttyname(s))'",
                    cwd=workdir, user=as_user, nobody=nobody_env)
        lines = r.stdout.splitlines()
        assert lines[0] == "ptmx", r.stdout + r.stderr
        assert "write=0" not in lines and "read=1" in lines
        own = [line for line in lines if line.startswith("own")]
        assert own and own[0].split()[1] == "ok" and own[0].split()[2] == "/dev/pts/0", r.stderr
        os.set_blocking(master, False)
        with pytest.raises(BlockingIOError):
            os.read(master, 64)  # nothing reached the other terminal
    finally:
        os.close(master)
        os.close(slave)


def test_raw_disks_and_consoles_do_not_exist(workdir):
    r = sandbox("ls /dev", cwd=workdir)
    assert sorted(r.stdout.split()) == sorted(["fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr",
                                               "stdin", "stdout", "tty", "urandom", "zero"])


# --- paths are pinned -----------------------------------------------------------------


@pytest.mark.parametrize("flags", [["--writable", "/"], ["--cwd", "/"], ["--writable", "HOME"],
                                   ["--writable", "HOME_PARENT"]])
def test_root_and_home_are_never_writable_roots(flags, tmp_path, workdir):
    home = tmp_path / "home" / "user"
    home.mkdir(parents=True)
    env = dict(os.environ, HOME=str(home))
    flags = [{"HOME": str(home), "HOME_PARENT": str(home.parent)}.get(f, f) for f in flags]
    cwd = workdir if "--cwd" not in flags else "/"
    flags = [f for f in flags if f not in ("--cwd", "/")] if "--cwd" in flags else flags
    r = sandbox("echo ran", cwd=cwd, flags=flags, env=env)
    assert r.returncode == 2 and "ran" not in r.stdout
    assert "refusing to make" in r.stderr and "writable" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_danger_full_access_may_run_in_root(tmp_path):
    r = sandbox("echo ran", cwd="/", flags=["--sandbox", "danger-full-access"])
    assert r.stdout == "ran\n", r.stderr


def test_symlinked_workspace_resolves_on_the_trusted_side(open_tmp):
    link = open_tmp / "ws"
    link.symlink_to("/")
    r = sandbox("echo pwned > /etc/sl-pwned; echo ran", cwd=link)
    assert "ran" not in r.stdout and "refusing to make / writable" in r.stderr
    assert not os.path.exists("/etc/sl-pwned")


@pytest.mark.parametrize("swap", ["symlink", "directory"])
def test_workspace_swapped_while_the_command_starts_is_refused(swap, open_tmp):
    ws = open_tmp / "ws"
    ws.mkdir()
    policy = SandboxPolicy.from_mode("workspace-write")
    env = {"PATH": os.environ["PATH"]}
    plan = _check(["touch", "pwned"], str(ws), policy, None, env)  # what the trusted side resolved
    ws.rename(open_tmp / "old")
    if swap == "symlink":
        ws.symlink_to("/var/tmp")
    else:
        ws.mkdir()
    spec = _encode_spec(["sh", "-c", "touch pwned; echo ran"], str(ws), env, policy, plan)
    r, w = os.pipe()
    proc = _make_warm(_Template.make([]), reap=True).start(spec, None, w, w)
    os.close(w)
    outcome = proc.wait(30)
    out = os.read(r, 65536)
    os.close(r)
    proc.close()
    assert outcome.exit_code == 126 and "changed while the command was starting" in outcome.error
    assert b"ran" not in out
    assert not os.path.exists("/var/tmp/pwned") and not (open_tmp / "old" / "pwned").exists()


def test_bad_directories_are_one_line_errors(tmp_path):
    with pytest.raises(SandboxError, match="refusing to make / writable"):
        _check(["true"], "/", SandboxPolicy.from_mode("workspace-write"), None, {})


# --- the workspace keeps its shape ------------------------------------------------------


def test_workspace_cannot_be_renamed_removed_or_replaced(as_user, nobody_env, workdir):
    (workdir / "keep").write_text("x")
    os.chmod(workdir / "keep", 0o666)
    r = sandbox('here="$PWD"; mv "$here" "$here.moved"; echo mv=$?; cd /; rm -rf "$here" 2>/dev/null; '
                'mkdir -p "$here.new/.git"; mv "$here.new" "$here"; echo replace=$?; ln -sfn / "$here"; '
                'echo end', cwd=workdir, user=as_user, nobody=nobody_env)
    assert "mv=1" in r.stdout and "end" in r.stdout, r.stderr
    assert workdir.is_dir() and not workdir.is_symlink()
    assert (workdir / ".git" / "config").read_text() == "[core]\n"
    assert not pathlib.Path(f"{workdir}.moved").exists()
    # A later command in the same place is as contained as the first.
    r = sandbox("echo pwned > /etc/sl-pwned2; pwd", cwd=workdir)
    assert r.stdout.strip() == str(workdir) and not os.path.exists("/etc/sl-pwned2")


def test_no_directory_on_the_way_to_a_hidden_one_can_be_renamed(as_user, nobody_env, workdir):
    """A hidden directory two levels down in the workspace (a daemon's allow list, say):
    renaming a parent would move the real one out from under its cover."""
    secret = workdir / "cfg" / "allow"
    secret.mkdir(parents=True)
    (secret / "client.key").write_text("key\n")
    for d in (workdir / "cfg", secret):
        os.chmod(d, 0o777)
    swap = "mv cfg moved; echo moved=$?; ls moved/allow 2>/dev/null; touch cfg/ok; echo wrote=$?"
    # Where it should, it works: the same shell, unsandboxed, on a copy.
    copy = workdir.parent / "copy"
    shutil.copytree(workdir, copy)
    r = subprocess.run(["sh", "-c", swap], cwd=copy, capture_output=True, text=True)
    assert r.stdout.split()[:2] == ["moved=0", "client.key"], r.stdout + r.stderr
    r = sandbox(swap, cwd=workdir, user=as_user, nobody=nobody_env, flags=("--hide", str(secret)))
    assert r.stdout.split() == ["moved=1", "wrote=0"], r.stdout + r.stderr
    assert os.listdir(secret) == ["client.key"] and (workdir / "cfg" / "ok").exists()
    # Swapped for a link since (by a command of a sandbox that did not hide it): the way to
    # it is not followed, and the command does not start.
    shutil.move(workdir / "cfg", workdir / "real")
    (workdir / "cfg").symlink_to("real")
    r = sandbox("echo ran", cwd=workdir, user=as_user, nobody=nobody_env, flags=("--hide", str(secret)))
    assert "ran" not in r.stdout and "the way to it changed" in r.stderr, r.stdout + r.stderr


def _fsmonitor_config(marker: str) -> str:
    return f"[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch {marker}\\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_new_git_in_the_workspace_is_moved_aside_before_git_runs(as_user, nobody_env, open_tmp, tmp_path):
    ws = open_tmp / "fresh"
    ws.mkdir()
    (ws / "sub").mkdir()
    os.chmod(ws, 0o777)
    os.chmod(ws / "sub", 0o777)
    marker = tmp_path / "fsmonitor-ran"
    plant = (f"mkdir -p .git/objects .git/refs && echo 'ref: refs/heads/main' > .git/HEAD && "
             f"printf '{_fsmonitor_config(marker)}' > .git/config")
    r = sandbox(f"{plant} && cd sub && {plant} && echo planted", cwd=ws, user=as_user, nobody=nobody_env)
    assert "planted" in r.stdout, r.stderr
    assert not (ws / ".git").exists() and not (ws / "sub" / ".git").exists()
    aside = [n for n in os.listdir(ws) if n.startswith(".git.sluice-blocked-")]
    assert len(aside) == 1 and f"moved it to {ws}/{aside[0]}" in r.stderr
    for where in (ws, ws / "sub"):
        subprocess.run(["git", "status"], cwd=where, capture_output=True, timeout=30,
                       env=dict(os.environ, GIT_CEILING_DIRECTORIES=str(open_tmp)))
    assert not marker.exists()


SWAP_GIT_LINK = {"replace": "rm .git && mkdir .git && echo '[core]' > .git/config && echo done",
                 "remove": "rm .git && echo done",
                 "relink": "ln -sfn /tmp .git && echo done"}


@pytest.mark.parametrize("how", sorted(SWAP_GIT_LINK))
def test_git_symlink_target_is_read_only_and_the_link_is_put_back(how, as_user, nobody_env, workdir):
    real = workdir / "store.git"
    shutil.move(workdir / ".git", real)
    (workdir / ".git").symlink_to("store.git")
    # Where it should, it works: the same shell, unsandboxed, on a copy.
    copy = workdir.parent / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    subprocess.run(["sh", "-c", SWAP_GIT_LINK[how]], cwd=copy, check=True, capture_output=True)
    assert not (copy / ".git").is_symlink() or os.readlink(copy / ".git") != "store.git"
    r = sandbox("(echo hook > .git/hooks-post) 2>/dev/null; echo a=$?; (echo hook > store.git/hooks-post) 2>/dev/null; "
                f"echo b=$?; {SWAP_GIT_LINK[how]}", cwd=workdir, user=as_user, nobody=nobody_env)
    assert "a=0" not in r.stdout.split() and "b=0" not in r.stdout.split(), r.stderr
    assert sorted(os.listdir(real)) == ["config"]
    assert "done" in r.stdout, r.stderr
    # The user's link is back as it was, and what stood in its place is moved aside.
    assert os.readlink(workdir / ".git") == "store.git"
    assert f"the command removed {workdir}/.git, a link to store.git; put it back" in r.stderr
    aside = [n for n in os.listdir(workdir) if n.startswith(".git.sluice-blocked-")]
    assert len(aside) == (0 if how == "remove" else 1), (os.listdir(workdir), r.stderr)


def test_nested_repository_and_gitdir_target_stay_read_only(as_user, nobody_env, workdir):
    nested = workdir / "vendored" / ".git"
    nested.mkdir(parents=True)
    (nested / "config").write_text("[core]\n")
    store = workdir / "worktree-store"
    store.mkdir()
    (workdir / "wt").mkdir()
    (workdir / "wt" / ".git").write_text(f"gitdir: {store}\n")
    for d in (nested.parent, nested, store, workdir / "wt"):
        os.chmod(d, 0o777)
    os.chmod(workdir / "wt" / ".git", 0o666)
    r = sandbox("echo h > vendored/.git/hooks && echo a=changed; echo h > worktree-store/hooks && echo b=changed; "
                "echo 'gitdir: /tmp/evil' > wt/.git && echo c=changed; echo end", cwd=workdir, user=as_user,
                nobody=nobody_env)
    assert r.stdout.split() == ["end"], r.stderr
    assert r.stderr.count("Read-only file system") == 3
    assert os.listdir(nested) == ["config"] and os.listdir(store) == []
    assert (workdir / "wt" / ".git").read_text() == f"gitdir: {store}\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_read_commands_work_in_an_existing_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=n"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "f").write_text("one\n")
    subprocess.run([*git, "add", "f"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=repo, check=True)
    (repo / "f").write_text("two\n")
    r = sandbox("git status --short; git log --oneline | wc -l; git diff --stat | tail -1", cwd=repo)
    lines = r.stdout.splitlines()
    assert lines[0] == " M f" and lines[1] == "1" and "1 file changed" in lines[2], r.stderr


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_node_runs_and_writes_its_workspace(workdir):
    r = sandbox("node -e \"require('fs').writeFileSync('out.txt', 'node ok'); console.log('ran')\"", cwd=workdir)
    assert r.stdout.strip() == "ran", r.stderr
    assert (workdir / "out.txt").read_text() == "node ok"


# --- control planes made after the command started ------------------------------------------


def test_daemon_started_after_the_command_is_out_of_its_reach(daemon_factory, workdir):
    """A sandboxed command that is already running when a daemon starts (its runtime dir
    in the host's /tmp, made after the sandbox) finds neither its token nor its socket."""
    go = workdir / "go"
    probe = (
        "import os, socket, time\n"
        "while not os.path.exists('go'): time.sleep(0.01)\n"
        "rt = open('go').read().strip()\n"
        "print('dir', os.path.exists(rt))\n"
        "try: print('token', open(rt + '/token').read())\n"
        "except OSError as e: print('token refused', e.errno)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try: s.connect(rt + '/broker.sock'); print('socket connected')\n"
        "except OSError as e: print('socket refused', e.errno)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try: s.connect(rt + '/run.sock'); print('run.sock connected')\n"
        "except OSError as e: print('run.sock refused', e.errno)\n"
    )
    (workdir / "probe.py").write_text(probe)
    argv = [sys.executable, "-m", "landlock_helper", "--cwd", str(workdir), "--", "/usr/bin/python3", "probe.py"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        handle = daemon_factory.start(executors=1)
        token = handle.runtime.read_token()
        go.write_text(handle.runtime.path)
        out, err = proc.communicate(timeout=30)
    finally:
        reap(proc)
    assert token and token not in out
    assert "dir False" in out and "token refused" in out and "socket refused" in out, out + err
    assert "run.sock refused" in out, out + err


def test_danger_full_access_as_root_can_undo_the_cover(open_tmp, workdir):
    """What docs/sandbox.md says danger-full-access does not hide, shown: a root command in it
    keeps its capabilities and can unmount what covers a hidden directory."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    hidden = open_tmp / "runtime"
    hidden.mkdir()
    (hidden / "token").write_text("s3cret")
    r = sandbox(f"cat {hidden}/token; umount {hidden} && cat {hidden}/token", cwd=workdir,
                flags=["--sandbox", "danger-full-access", "--hide", str(hidden)])
    assert r.stdout == "s3cret", r.stderr
    assert "No such file or directory" in r.stderr  # covered until unmounted


def test_hidden_path_inside_a_writable_root_stays_hidden(as_user, nobody_env, workdir):
    """An allow list or runtime dir that lies inside the workspace is still covered, though
    the workspace itself is bound read-write on top of the view."""
    hidden = workdir / "allow"
    hidden.mkdir()
    (hidden / "daemon.key").write_text("public key")
    os.chmod(hidden, 0o777)
    r = sandbox("ls -A allow; echo planted > allow/mine.key; echo end", cwd=workdir,
                flags=["--hide", str(hidden)], user=as_user, nobody=nobody_env)
    assert "daemon.key" not in r.stdout and r.stdout.strip() == "end", r.stderr
    assert os.listdir(hidden) == ["daemon.key"]


# --- sluice's /tmp cannot be squatted ------------------------------------------------------


@pytest.mark.parametrize("squat", ["other owner", "open mode", "symlink"])
def test_private_tmp_planted_by_someone_else_is_refused(squat, tmp_path):
    """Another local user who makes /tmp/sluice-tmp-UID first (theirs, world-writable, or a
    link to somewhere of theirs) gets no sandbox of ours to use it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to play the other user")
    uid = 40000 + os.getpid() % 20000  # a uid nobody uses, standing for the victim
    path = f"/tmp/sluice-tmp-{uid}"
    try:
        if squat == "symlink":
            os.symlink(str(tmp_path), path)
        else:
            os.mkdir(path, 0o777 if squat == "open mode" else 0o700)
            os.chmod(path, 0o777 if squat == "open mode" else 0o700)
            os.chown(path, uid if squat == "open mode" else 65534, -1)
        with pytest.raises((mounts.PinError, OSError)):
            mounts.scratch_dir(uid)
        assert os.listdir(tmp_path) == []
    finally:
        if os.path.islink(path):
            os.unlink(path)
        else:
            shutil.rmtree(path, ignore_errors=True)


def test_private_tmp_is_private_to_its_user():
    path = mounts.scratch_dir()
    st = os.lstat(path)
    assert path == f"/tmp/sluice-tmp-{os.geteuid()}"
    assert (st.st_uid, st.st_mode & 0o7777) == (os.geteuid(), 0o700)


def test_a_link_planted_in_sluices_tmp_does_not_redirect_a_workspace(open_tmp):
    """An earlier command leaves, in sluice's /tmp, a symlink where a later command's
    workspace (in the host's /tmp) must be shown; the later command still gets its own
    workspace, not the link's target."""
    ws = open_tmp / "later"
    ws.mkdir()
    elsewhere = tempfile.mkdtemp(prefix="sl-elsewhere-", dir="/var/tmp")
    try:
        first = sandbox(f"mkdir -p {open_tmp} && rm -rf {ws} && ln -s /etc {ws} && echo planted", cwd=elsewhere)
    finally:
        shutil.rmtree(elsewhere)
    assert "planted" in first.stdout, first.stderr
    r = sandbox("touch made && pwd && ls", cwd=ws)
    assert r.stdout.split() == [str(ws), "made"], r.stderr
    assert (ws / "made").exists() and not os.path.exists("/etc/made")


def test_running_inside_git_does_not_make_it_writable(as_user, nobody_env, workdir):
    """.git is never a writable root; run in it read-only, the command's directory is
    opened after every mount is in place and gets no more than the read-only view."""
    r = sandbox("echo ran", cwd=workdir / ".git", user=as_user, nobody=nobody_env)
    assert r.returncode == 2 and "inside a repository's .git" in r.stderr and "ran" not in r.stdout
    r = sandbox("echo hook > hooks-planted; echo x >> config; pwd; echo end", cwd=workdir / ".git",
                flags=["--sandbox", "read-only", "--writable", str(workdir)], user=as_user, nobody=nobody_env)
    assert r.stdout.split() == [str(workdir / ".git"), "end"], r.stderr
    assert sorted(os.listdir(workdir / ".git")) == ["config"]
    assert (workdir / ".git" / "config").read_text() == "[core]\n"


def test_sluice_run_in_the_home_directory_says_why_in_one_line(daemon_factory, tmp_path):
    """The home directory of the user it runs as (and /) is refused before anything is
    sent, as a usage error; the executor refuses it too (test_bad_directories_...)."""
    home = tmp_path / "home"
    home.mkdir()
    daemon = daemon_factory.start(executors=1, env={"HOME": str(home)})
    env = dict(daemon.env, HOME=str(home))
    for where, flags in ((home, []), ("/", []), (home, ["--via-broker"])):
        r = subprocess.run([*sluice_argv(), "run", *flags, "--", "true"], cwd=where, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and r.stdout == ""  # a usage error, as `sluice sandbox` says it
        assert r.stderr.count("\n") == 1 and f"refusing to make {where} writable" in r.stderr, r.stderr
    r = subprocess.run([*sluice_argv(), "run", "--sandbox", "read-only", "--", "pwd"], cwd=home, env=env,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, f"{home}\n"), r.stderr


# Pushes "INJECTED" into its stdin's terminal input queue, as if typed there: on the
# person's terminal, their shell would run it once the sandbox is gone.
_TIOCSTI = ("import fcntl, termios\n"
            "try:\n"
            "    for c in b'echo INJECTED\\n':\n"
            "        fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))\n"
            "    print('pushed')\n"
            "except OSError as e:\n"
            "    print('refused', e.errno)\n")


@pytest.mark.timeout(60)
def test_a_command_on_the_persons_terminal_cannot_type_into_it(tmp_path):
    """``python -m landlock_helper`` on a terminal hands the command no terminal of the
    person's (it relays it through pipes, landlock_helper/relay.py, as ``sluice sandbox``
    and ``sluice run`` do): TIOCSTI (type into it) has no terminal to type into, whatever
    ``dev.tty.legacy_tiocsti`` says. (Handed the terminal, the command's session of its
    own refused it with EPERM.)"""
    import pty
    import select

    pid, leader = pty.fork()
    if pid == 0:  # the person's shell on the terminal, running the sandbox
        os.execv(sys.executable, [sys.executable, "-m", "landlock_helper", "--cwd", str(tmp_path), "--",
                                  INNER_PYTHON, "-c", _TIOCSTI])
    out = b""
    try:
        while select.select([leader], [], [], 30)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's last user is gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(leader)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert f"refused {errno.ENOTTY}".encode() in out and b"pushed" not in out, out
