"""What the agent does with the user's rights: nothing. Attacks on its side, each shown
working where it should (with the user's rights, or past the old path check), then
contained: a Session over a real daemon (real executors, the real sandbox), driven by a
scripted model.

1. a patch into a subdirectory's ``.git`` (and one approved into the root's, written
for itself alone); 2. a directory of a patch's path swapped for
a symlink while patches are applied; 3. a patch to ``/tmp``; 4. a patch planting a
repository; 5. ``AGENTS.md`` as a symlink to what the sandbox hides, or a FIFO.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from agent.exec_runner import BrokerRunner
from agent.safety import AutoApprove, assess_patch_safety, writable_roots_for
from broker.wire.protocol import AskForApproval, PatchApproval, ReviewDecision, UnifiedExecSettings
from landlock_helper import fileops, mounts
from landlock_helper.policy import FULL_READ, WRITE_CWD, SandboxPolicy
from tests.support.fake_model import FakeModelServer, Harness, assistant, call, outputs_of, response, tag

pytestmark = pytest.mark.timeout(120)

WORKSPACE = SandboxPolicy.from_mode("workspace-write")


def patch(call_id: str, body: str):
    return response(call("apply_patch", {"input": f"*** Begin Patch\n{body}\n*** End Patch"}, call_id))


def answers(server: FakeModelServer) -> dict[str, str]:
    found: dict[str, str] = {}
    for request in server.requests:
        found.update(outputs_of(request["json"]))
    return found


def session(server: FakeModelServer, handle, tmp_path: Path, body) -> None:
    async def main() -> None:
        runner = await BrokerRunner.connect(handle.runtime)
        h = Harness(server, runner, tmp_path)
        try:
            await body(h)
        finally:
            await h.session.aclose()
            await runner.aclose()

    asyncio.run(main())


def auto_approved(paths: list[str], cwd: Path) -> bool:
    """What the path check (the only guard before patches went through the sandbox) says."""
    roots = writable_roots_for(WORKSPACE, str(cwd))
    safety = assess_patch_safety(paths, AskForApproval.ON_REQUEST, roots, str(cwd), sandbox_policy=WORKSPACE)
    return isinstance(safety, AutoApprove)


async def one_turn(h: Harness, **configure) -> str:
    await h.configure(**{"sandbox_policy": WORKSPACE, **configure})
    sub = await h.say("go")
    assert tag(await h.done(sub, timeout=60)) == "task_complete"
    return sub


# -- 1: a subdirectory's .git ---------------------------------------------------------


def test_patch_cannot_write_a_subdirectory_git(module_daemon, tmp_path) -> None:
    ws = tmp_path / "work"
    config = ws / "sub" / ".git" / "config"
    config.parent.mkdir(parents=True)
    config.write_text("[core]\n")
    # The attack: the path check lets the write through unasked (only .git directly in a
    # root is read-only to it), and git in sub/ would run the fsmonitor.
    assert auto_approved([str(config)], ws)
    with FakeModelServer() as server:
        server.script(
            patch("p1", "*** Update File: sub/.git/config\n@@\n [core]\n+\tfsmonitor = touch /tmp/pwned"),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            sub = await one_turn(h)
            assert not h.of("apply_patch_approval_request", sub)
            end = h.of("patch_apply_end", sub)[0]
            assert not end.success and "Read-only file system" in end.stderr, end

        session(server, module_daemon, tmp_path, body)
    assert config.read_text() == "[core]\n"
    assert "Failed to write file sub/.git/config: Read-only file system" in answers(server)["p1"]


@pytest.mark.parametrize("decision", [ReviewDecision.APPROVED, ReviewDecision.DENIED])
def test_an_approved_patch_into_the_root_git_is_written_for_itself(module_daemon, tmp_path, decision) -> None:
    # The workspace's own .git is read-only in the sandbox, and never a root to grant
    # (the sandbox would refuse it, and with it every later command): approved, the one
    # patch is written without the write restrictions; the session's policy is unchanged.
    # (Not workspace-write: tmp_path is in /tmp, a root of its own that holds work/.git.)
    policy = SandboxPolicy.of((FULL_READ, WRITE_CWD))
    ws = tmp_path / "work"
    config = ws / ".git" / "config"
    config.parent.mkdir(parents=True)
    config.write_text("[core]\n")
    with FakeModelServer() as server:
        server.script(
            patch("p1", "*** Update File: .git/config\n@@\n [core]\n+\tbare = false"),
            response(call("shell", {"command": ["bash", "-c", "echo next > next.txt; touch .git/probe"]}, "c1")),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            await h.configure(sandbox_policy=policy)
            sub = await h.say("go")
            request = (await h.until("apply_patch_approval_request", timeout=60)).msg
            assert request.grant_root is None and "a repository's protected .git" in request.reason, request
            await h.submit(PatchApproval(sub, decision))
            assert tag(await h.done(sub, timeout=60)) == "task_complete"
            assert h.session.granted_roots == []
            assert len(h.of("exec_approval_request", sub)) == 0

        session(server, module_daemon, tmp_path, body)
    said = answers(server)
    if decision == ReviewDecision.APPROVED:
        assert config.read_text() == "[core]\n\tbare = false\n"
    else:
        assert config.read_text() == "[core]\n" and said["p1"] == "patch rejected by user"
    # The session's next command still starts, in the sandbox as before: .git stays read-only.
    assert (ws / "next.txt").read_text() == "next\n"
    assert not (ws / ".git" / "probe").exists()
    assert "Read-only file system" in said["c1"], said["c1"]


# -- 2: a symlink swapped in while patches are applied ---------------------------------

SWAP_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
/* Exchange argv[1] and argv[2] (RENAME_EXCHANGE) as fast as possible for argv[3] seconds. */
int main(int argc, char **argv) {
    time_t end = time(NULL) + atoi(argv[3]);
    long n = 0;
    while (time(NULL) < end)
        if (syscall(SYS_renameat2, AT_FDCWD, argv[1], AT_FDCWD, argv[2], 2) == 0)
            n++;
    printf("swapped %ld times\n", n);
    return 0;
}
"""
PATCHES = 40


@pytest.fixture
def swapper(tmp_path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the swapper")
    source = tmp_path / "swap.c"
    source.write_text(SWAP_C)
    binary = tmp_path / "work" / "swap"
    binary.parent.mkdir(exist_ok=True)
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(source)], check=True, capture_output=True)
    return binary


def test_symlink_race_never_lands_outside(module_daemon, tmp_path, swapper, outside) -> None:
    ws = swapper.parent
    (ws / "d").mkdir()
    os.symlink(outside, ws / "dl")
    victim = Path(outside) / "victim"

    # The attack, with the user's rights: check that d is inside the workspace, then
    # write through it; the swapper wins the race.
    proc = subprocess.Popen([str(swapper), "d", "dl", "20"], cwd=ws, stdout=subprocess.DEVNULL)
    try:
        landed = None
        deadline = time.monotonic() + 15
        while landed is None and time.monotonic() < deadline:
            target = ws / "d" / f"race-{secrets.token_hex(4)}"
            try:
                if os.path.realpath(ws / "d").startswith(str(ws) + "/"):  # the check
                    target.write_text("x")  # the act
            except OSError:
                continue  # caught mid-swap: try again
            if (Path(outside) / target.name).exists():
                landed = target.name
    finally:
        proc.kill()
        proc.wait()
    assert landed is not None, "the race was never won with the user's rights"
    os.unlink(Path(outside) / landed)
    if os.path.islink(ws / "d"):
        os.rename(ws / "d", ws / "tmp-link")
        os.rename(ws / "dl", ws / "d")
        os.rename(ws / "tmp-link", ws / "dl")
    before = sorted(os.listdir(outside))

    with FakeModelServer() as server:
        server.script(
            response(call("exec_command", {"cmd": "./swap d dl 60", "yield_time_ms": 250}, "swap")),
            *(patch(f"p{i}", f"*** Add File: d/p{i}.txt\n+x") for i in range(PATCHES)),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            await h.configure(sandbox_policy=WORKSPACE, unified_exec=UnifiedExecSettings(tools="codex"))
            sub = await h.say("go")
            # A patch whose path led outside when it was checked asks to open that
            # directory: the user says no.
            asked = 0
            deadline = time.monotonic() + 90
            while not h.of("task_complete", sub):
                assert time.monotonic() < deadline, h.tags()
                requests = h.of("apply_patch_approval_request", sub)
                if len(requests) > asked:
                    asked += 1
                    await h.submit(PatchApproval(sub, ReviewDecision.DENIED))
                await asyncio.sleep(0.01)
            ends = h.of("patch_apply_end", sub)
            assert len(ends) + asked == PATCHES
            failed = [e for e in ends if not e.success]
            # The race was on: some patches met the symlink (and were refused, by the
            # sandbox or the user) ...
            assert failed or asked, "no patch met the swapped symlink"
            # ... and failed, saying so (where they could have gone is checked below).
            assert all(e.stderr.startswith("Failed to ") or "changed on disk" in e.stderr for e in failed), failed

        session(server, module_daemon, tmp_path, body)
    assert "Process running with session ID" in answers(server)["swap"]
    assert sorted(os.listdir(outside)) == before and victim.read_text() == "original\n"


# -- 3: the host's /tmp -----------------------------------------------------------------


def test_patch_to_tmp_lands_in_the_sandbox_tmp(module_daemon, tmp_path) -> None:
    name = f"sluice-agent-{secrets.token_hex(6)}.txt"
    host = Path("/tmp") / name
    # The attack: /tmp counts as writable, so the path check approves a write to the
    # host's /tmp (other repositories, other users' files, runtime dirs).
    assert auto_approved([str(host)], tmp_path / "work")
    private = Path(mounts.scratch_dir()) / name
    try:
        with FakeModelServer() as server:
            server.script(
                patch("p1", f"*** Add File: {host}\n+private"),
                response(call("shell", {"command": ["cat", str(host)]}, "c1")),
                response(assistant("Done.")),
            )

            async def body(h: Harness) -> None:
                sub = await one_turn(h)
                assert h.of("patch_apply_end", sub)[0].success

            session(server, module_daemon, tmp_path, body)
        assert not host.exists()
        assert private.read_text() == "private\n"
        assert "private" in answers(server)["c1"]  # what the session's commands see as /tmp
    finally:
        private.unlink(missing_ok=True)
        host.unlink(missing_ok=True)


# -- 4: a new repository ------------------------------------------------------------------


def test_patch_cannot_plant_a_repository(module_daemon, tmp_path) -> None:
    ws = tmp_path / "work"
    (ws / "src").mkdir(parents=True)
    planted = ["src/.git/HEAD", "src/.git/config", "sub/.sluice/config.toml"]
    # The attack: the path check approves it (nothing is there to be read-only yet).
    assert auto_approved([str(ws / p) for p in planted], ws)
    with FakeModelServer() as server:
        server.script(
            patch("p1", "*** Add File: src/.git/HEAD\n+ref: refs/heads/main\n"
                        "*** Add File: src/.git/config\n+[core]\n+\tfsmonitor = touch /tmp/pwned"),
            patch("p2", "*** Add File: sub/.sluice/config.toml\n+x = 1"),
            patch("p3", "*** Add File: src/.git\n+gitdir: /tmp/elsewhere"),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            sub = await one_turn(h)
            ends = h.of("patch_apply_end", sub)
            assert [e.success for e in ends] == [False, False, False]
            assert all("Operation not permitted (a patch may not create" in e.stderr for e in ends), ends

        session(server, module_daemon, tmp_path, body)
    assert sorted(os.listdir(ws)) == ["src"] and os.listdir(ws / "src") == []


# -- 5: AGENTS.md ---------------------------------------------------------------------------


@pytest.fixture
def var_tmp_dir():
    """A directory outside /tmp (so hiding it is the sandbox's doing, not its private /tmp)."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else os.path.expanduser("~")
    path = tempfile.mkdtemp(prefix="sluice-home-", dir=base)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_agents_md_shows_nothing_the_sandbox_hides(daemon_factory, tmp_path, var_tmp_dir) -> None:
    home = var_tmp_dir / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(f"api_key = 'home-{secrets.token_hex(8)}'\n")
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(home)})
    host_tmp = Path(tempfile.mkdtemp(prefix="sluice-secret-", dir="/tmp"))
    try:
        (host_tmp / "secret").write_text(f"tmp-{secrets.token_hex(8)}\n")
        targets = {"token": handle.runtime.token_path, "home": str(home / "config.toml"),
                   "tmp": str(host_tmp / "secret")}
        projects = {}
        for name, target in targets.items():
            project = tmp_path / name
            project.mkdir()
            os.symlink(target, project / "AGENTS.md")
            # The attack: the link reads the secret with the user's rights.
            assert (project / "AGENTS.md").read_text().strip() == Path(target).read_text().strip()
            projects[name] = project
        plain = tmp_path / "plain"
        plain.mkdir()
        (plain / "AGENTS.md").write_text("plain project rules\n")

        with FakeModelServer() as server:
            server.script(*(response(assistant("ok")) for _ in range(len(projects) + 1)))

            async def body(h: Harness) -> None:
                for project in (*projects.values(), plain):
                    await h.configure(sandbox_policy=WORKSPACE, cwd=str(project))
                    sub = await h.say("hi")
                    assert tag(await h.done(sub, timeout=30)) == "task_complete"

            session(server, handle, tmp_path, body)
        sent = [str(request["json"]) for request in server.requests]
        assert len(sent) == len(projects) + 1
        for target in targets.values():
            secret = Path(target).read_text().strip()
            assert not any(secret in body for body in sent), target
        assert "plain project rules" in sent[-1]  # docs are read, where the sandbox sees them
    finally:
        shutil.rmtree(host_tmp, ignore_errors=True)


def test_agents_md_fifo_does_not_hold_up_the_session(module_daemon, tmp_path) -> None:
    ws = tmp_path / "work"
    ws.mkdir()
    fifo = ws / "AGENTS.md"
    os.mkfifo(fifo)
    # The attack: opening it for reading, as a plain open does, waits for a writer.
    reader = threading.Thread(target=lambda: open(fifo, "rb").close(), daemon=True)
    reader.start()
    reader.join(0.5)
    assert reader.is_alive()
    with open(fifo, "wb"):  # lets the reader go
        pass
    reader.join(10)

    with FakeModelServer() as server:
        server.script(response(assistant("ok")))

        async def body(h: Harness) -> None:
            configured = await asyncio.wait_for(h.configure(sandbox_policy=WORKSPACE), 10)
            assert tag(configured) == "session_configured"
            sub = await h.say("hi")
            assert tag(await h.done(sub, timeout=30)) == "task_complete"

        session(server, module_daemon, tmp_path, body)


# -- the builtin itself, as root and as an unprivileged user ------------------------------

RUN_BUILTIN = r"""
import os, sys
from landlock_helper import fileops
from landlock_helper.policy import FULL_READ, WRITE_CWD, SandboxPolicy
from landlock_helper.spawn import spawn
cwd, batch = sys.argv[1], sys.argv[2].encode()
r_in, w_in = os.pipe()
r_out, w_out = os.pipe()
proc = spawn([fileops.PROGRAM], cwd=cwd, env={}, policy=SandboxPolicy.from_mode("workspace-write"),
             stdout=w_out, stderr=2, stdin=r_in, builtin="fileops")
os.close(r_in)
os.close(w_out)
os.write(w_in, batch)
os.close(w_in)
out = b""
while chunk := os.read(r_out, 1 << 16):
    out += chunk
outcome = proc.wait(30)
sys.stdout.write(out.decode())
sys.exit(outcome.exit_code if outcome.exit_code is not None else 99)
"""


def _batch(proj: Path, name: str) -> list[dict]:
    return [fileops.write_op(str(proj / "sub/.git/config"), b"[core]\n\tfsmonitor = x\n", b"[core]\n"),
            fileops.write_op(f"/tmp/{name}", b"t", None)]


def _project(base: Path) -> Path:
    proj = base / "proj"
    (proj / "sub/.git").mkdir(parents=True)
    (proj / "sub/.git/config").write_text("[core]\n")
    for d in (proj, proj / "sub", proj / "sub/.git"):
        os.chmod(d, 0o777)
    os.chmod(proj / "sub/.git/config", 0o666)
    return proj


def test_the_builtin_holds_as_root_and_as_nobody(as_user, nobody_env, open_tmp) -> None:
    name = f"sluice-builtin-{secrets.token_hex(6)}"
    # The attack: the same batch with the user's rights writes the .git and the host's /tmp.
    twin = _project(open_tmp / "twin")
    assert fileops.run({"ops": _batch(twin, name)})["failed"] is None
    assert "fsmonitor" in (twin / "sub/.git/config").read_text()
    os.unlink(f"/tmp/{name}")

    proj = _project(open_tmp / "w")
    python, lib = nobody_env
    argv = [python, "-c", RUN_BUILTIN, str(proj)]
    env = {**os.environ, "PYTHONPATH": lib}
    if as_user == "nobody":
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        env["HOME"] = "/nonexistent"
    # The sluice code that runs the builtin lies in the host's /tmp: the sandbox does not
    # see it (nor needs to).
    code = str(Path(lib) / "landlock_helper" / "fileops.py")
    looked = subprocess.run([*argv, fileops.encode({"ops": [fileops.read_op(code)]}).decode()],
                            capture_output=True, text=True, env=env, timeout=60)
    assert looked.returncode == 0, looked.stderr
    assert fileops.decode(looked.stdout.encode())["results"][0]["kind"] == "none"

    scratch = Path(f"/tmp/sluice-tmp-{0 if as_user == 'root' else 65534}")
    try:
        ran = subprocess.run([*argv, fileops.encode({"ops": _batch(proj, name)[:1]}).decode()],
                             capture_output=True, text=True, env=env, timeout=60)
        assert ran.returncode == 0, ran.stderr
        failed = fileops.decode(ran.stdout.encode())["failed"]
        assert failed["stage"] == "write" and failed["error"] == "Read-only file system", failed
        assert (proj / "sub/.git/config").read_text() == "[core]\n"
        ran = subprocess.run([*argv, fileops.encode({"ops": _batch(proj, name)[1:]}).decode()],
                             capture_output=True, text=True, env=env, timeout=60)
        assert fileops.decode(ran.stdout.encode())["failed"] is None, ran.stdout
        assert not os.path.exists(f"/tmp/{name}") and (scratch / name).read_text() == "t"
    finally:
        (scratch / name).unlink(missing_ok=True)
