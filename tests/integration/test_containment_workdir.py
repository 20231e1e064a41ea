"""Adversarial: the model chooses where a command runs, never where it may write.

Threat: the model (hostile, or steered by a prompt injection in a file it read) gives a
``shell`` call (or ``container.exec``, or a ``local_shell_call`` item) a ``workdir`` of
its choosing: ``/``, ``/var/tmp`` or any directory outside the workspace, ``../..``,
or the workspace's ``.git``. Were the directory a command runs in the one the sandbox's
``disk-write-cwd`` makes writable, then under the default policies (``on-request``,
``workspace-write``), without any prompt, a command could write anywhere on the disk
the user can (everywhere, as root) or plant a hook in ``.git`` that the user's next git
command runs outside any sandbox.

What must hold, each checked here through the real path (a scripted model, the daemon,
its agent process, an executor, the kernel sandbox): the command does run in the
directory asked for (``pwd`` prints it), its write there fails and creates nothing, and
its write into the session's cwd still succeeds. A patch is judged against the
session's writable roots, not its workdir. A workdir that is not a directory is an
error the model reads, and nothing runs. One level down, an executor given a
``RunRequest`` whose ``sandbox_cwd`` differs from its ``cwd`` makes only ``sandbox_cwd``
writable, and one without ``sandbox_cwd`` (``sluice run --cwd``) makes ``cwd`` writable.

Workspaces live under /var/tmp, not /tmp: ``workspace-write`` makes /tmp writable, so a
workspace under it would make ``../..`` writable by the policy itself. The daemon runs
with ``TMPDIR=/tmp`` so no other temp root widens the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import msgspec
import pytest

from agent.tool_calls import WorkdirError, resolve_workdir
from broker.client import make_request
from broker.wire.protocol import (
    AskForApproval,
    ConfigureSession,
    ModelProviderInfo,
    Shutdown,
    TextInput,
    UserInput,
    WireApi,
)
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import (
    FakeModelServer,
    FakeRunner,
    Harness,
    assistant,
    call,
    local_shell_call,
    outputs_of,
    response,
    tag,
)
from tests.support.harness import daemons, short_tempdir

pytestmark = pytest.mark.timeout(60)

KEY = "sk-workdir-test-3e9a51c7"
EVENT_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def dmn():
    home = short_tempdir("sl-home-")
    try:
        with daemons() as factory:
            yield factory.start(executors=2, env={"SLUICE_HOME": home, "TMPDIR": "/tmp"})
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def base():
    """A fresh directory outside /tmp holding ``a/ws`` (the session's cwd, with a ``.git``)."""
    path = Path(tempfile.mkdtemp(prefix="sl-wd-", dir="/var/tmp"))
    try:
        ws = path / "a" / "ws"
        (ws / ".git" / "hooks").mkdir(parents=True)
        (ws / ".git" / "config").write_text("[core]\n")
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def outside():
    """A directory outside the workspace (and outside every writable root)."""
    path = Path(tempfile.mkdtemp(prefix="sl-wd-out-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def configure_op(server: FakeModelServer, cwd: Path, approval: AskForApproval) -> ConfigureSession:
    return ConfigureSession(
        provider=ModelProviderInfo(name="fake", base_url=server.base_url, env_key="FAKE_KEY",
                                   wire_api=WireApi.RESPONSES, stream_max_retries=1, request_max_retries=1),
        model="test-model", approval_policy=approval, sandbox_policy=SandboxPolicy.from_mode("workspace-write"),
        cwd=str(cwd), api_key=KEY)


def collect(session, until: str) -> list:
    """Events up to and including the first ``until``; fails on an error event or a stall."""
    events = []
    while True:
        event = session.next_event(EVENT_TIMEOUT_S)
        assert event is not None, f"no {until} within {EVENT_TIMEOUT_S:g} s; got {[tag(e) for e in events]}"
        events.append(event)
        assert tag(event) != "error", f"error event: {event.msg}"
        if tag(event) == until:
            return events


def one_turn(dmn, server, ws: Path, item: dict, approval: AskForApproval = AskForApproval.ON_REQUEST):
    """The model answers ``item`` then "Done."; returns the turn's events and what the
    model was told about ``item`` (its function_call_output)."""
    server.script(response(item), response(assistant("Done.")))
    session = dmn.client().open_session(configure_op(server, ws, approval))
    try:
        collect(session, "session_configured")
        session.submit(UserInput([TextInput("go")]))
        events = collect(session, "task_complete")
    finally:
        session.submit(Shutdown())
        collect(session, "shutdown_complete")
    told = outputs_of(server.requests[1]["json"])[item["call_id"]]
    return events, told


def of(events, kind: str) -> list:
    return [e.msg for e in events if tag(e) == kind]


def attack(dmn, server, ws: Path, target: str, *, workdir: str | None = None, item: dict | None = None):
    """A command asked to run in ``workdir`` that prints its directory, tries to create
    ``target`` there and then writes ``inside`` into the workspace. Returns (pwd, the
    exec_command_end, the inside file)."""
    inside = ws / f"inside-{uuid.uuid4().hex[:8]}"
    script = f'pwd; echo pwned > {target}; echo "rc=$?"; echo ok > {inside}'
    if item is None:
        item = call("shell", {"command": ["bash", "-c", script], "workdir": workdir}, "c1")
    else:
        item["action"]["command"] = ["bash", "-c", script]
    events, told = one_turn(dmn, server, ws, item)
    assert not of(events, "exec_approval_request"), "the default policies never ask about this command"
    (begin,) = of(events, "exec_command_begin")
    (end,) = of(events, "exec_command_end")
    pwd = end.stdout.splitlines()[0]
    assert begin.cwd == pwd
    assert "rc=1" in end.stdout, end.aggregated_output
    assert "Permission denied" in end.stderr or "Read-only file system" in end.stderr, end.stderr
    assert "rc=1" in json.loads(told)["output"]
    assert inside.read_text() == "ok\n", "writing into the session's cwd must still work"
    return pwd, end


# -- through the agent ----------------------------------------------------------------


@pytest.mark.parametrize("workdir", ["/", "/var/tmp"])
def test_workdir_outside_runs_there_but_writes_nothing_there(dmn, server, base, workdir) -> None:
    ws = base / "a" / "ws"
    name = f"sl-wd-escape-{uuid.uuid4().hex}"
    target = os.path.join(workdir, name)
    try:
        pwd, _ = attack(dmn, server, ws, name, workdir=workdir)
        assert pwd == workdir
        assert not os.path.lexists(target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(target)


def test_absolute_workdir_outside_the_workspace_is_read_only(dmn, server, base, outside) -> None:
    ws = base / "a" / "ws"
    pwd, _ = attack(dmn, server, ws, "planted", workdir=str(outside))
    assert pwd == str(outside)
    assert os.listdir(outside) == []


def test_relative_workdir_above_the_workspace_is_read_only(dmn, server, base) -> None:
    ws = base / "a" / "ws"
    pwd, _ = attack(dmn, server, ws, "planted", workdir="../..")
    assert pwd == str(base)
    assert sorted(os.listdir(base)) == ["a"]


def test_git_as_workdir_stays_read_only(dmn, server, base) -> None:
    ws = base / "a" / "ws"
    pwd, _ = attack(dmn, server, ws, "hooks/pre-commit", workdir=".git")
    assert pwd == str(ws / ".git")
    assert sorted(os.listdir(ws / ".git")) == ["config", "hooks"]
    assert os.listdir(ws / ".git" / "hooks") == []
    assert (ws / ".git" / "config").read_text() == "[core]\n"


def test_local_shell_call_working_directory_is_read_only(dmn, server, base, outside) -> None:
    ws = base / "a" / "ws"
    item = local_shell_call([], "c1", working_directory=str(outside))
    pwd, _ = attack(dmn, server, ws, "planted", item=item)
    assert pwd == str(outside)
    assert os.listdir(outside) == []


def test_container_exec_workdir_is_read_only(dmn, server, base) -> None:
    ws = base / "a" / "ws"
    inside = ws / "inside"
    script = f'pwd; echo pwned > planted; echo "rc=$?"; echo ok > {inside}'
    events, told = one_turn(dmn, server, ws, call("container.exec", {"command": ["bash", "-c", script],
                                                                     "workdir": ".."}, "c1"))
    (end,) = of(events, "exec_command_end")
    assert end.stdout.splitlines() == [str(base / "a"), "rc=1"]
    assert sorted(os.listdir(base / "a")) == ["ws"] and inside.read_text() == "ok\n"


def test_missing_or_non_directory_workdir_is_an_error_for_the_model(dmn, server, base) -> None:
    ws = base / "a" / "ws"
    (ws / "file").write_text("x")
    for workdir, why in (("no/such/dir", "does not exist"), ("file", "is not a directory")):
        events, told = one_turn(dmn, server, ws, call("shell", {"command": ["touch", "made"], "workdir": workdir},
                                                      "c1"))
        assert told.startswith(f"error: workdir {workdir!r} {why}"), told
        assert not of(events, "exec_command_begin") and not (ws / "made").exists()
        server.requests.clear()


def test_patch_in_a_git_workdir_is_judged_by_the_session_roots(dmn, server, base) -> None:
    """apply_patch with workdir .git: its path is in no writable root, so under ``never``
    it is refused; with a workdir inside the workspace it applies."""
    ws = base / "a" / "ws"
    (ws / "sub").mkdir()
    hook = "*** Begin Patch\n*** Add File: hooks/pre-commit\n+#!/bin/sh\n+touch /pwned\n*** End Patch\n"
    events, told = one_turn(dmn, server, ws, call("shell", {"command": ["apply_patch", hook], "workdir": ".git"},
                                                  "c1"), approval=AskForApproval.NEVER)
    assert told.startswith("patch rejected:"), told
    assert not of(events, "patch_apply_begin") and os.listdir(ws / ".git" / "hooks") == []
    server.requests.clear()
    fine = "*** Begin Patch\n*** Add File: new.txt\n+hello\n*** End Patch\n"
    events, told = one_turn(dmn, server, ws, call("shell", {"command": ["apply_patch", fine], "workdir": "sub"},
                                                  "c1"), approval=AskForApproval.NEVER)
    assert of(events, "patch_apply_end")[0].success, told
    assert (ws / "sub" / "new.txt").read_text() == "hello\n"


# -- one level down: the executor -------------------------------------------------------


def test_executor_makes_only_sandbox_cwd_writable(dmn, base, outside) -> None:
    ws = base / "a" / "ws"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": "/tmp"}
    script = f'pwd; echo pwned > planted; echo "rc=$?"; echo ok > {ws}/inside'
    client = dmn.client()
    request = msgspec.structs.replace(make_request(["bash", "-c", script], cwd=str(outside), env=env),
                                      sandbox_cwd=str(ws))
    result = client.wait(client.submit_request(request), 30)
    assert result.stdout.decode().splitlines() == [str(outside), "rc=1"], result
    assert os.listdir(outside) == [] and (ws / "inside").read_text() == "ok\n"

    # No sandbox_cwd (an older client, sluice run --cwd): cwd is the writable one.
    result = client.wait(client.submit_request(make_request(["bash", "-c", "echo ok > made"], cwd=str(outside),
                                                            env=env)), 30)
    assert result.returncode == 0 and (outside / "made").read_text() == "ok\n"

    bad = msgspec.structs.replace(make_request(["true"], cwd=str(outside), env=env), sandbox_cwd="a/ws")
    result = client.wait(client.submit_request(bad), 30)
    assert result.error == "sandbox_cwd must be an absolute path: a/ws"


# -- the session, with a fake runner: what it asks the executor for ---------------------


def test_session_passes_its_cwd_as_sandbox_cwd_whatever_the_workdir(tmp_path) -> None:
    (tmp_path / "work" / ".git").mkdir(parents=True)
    workdirs = ["/", "..", ".git", str(tmp_path)]
    with FakeModelServer() as server:
        server.script(*[response(call("shell", {"command": ["true"], "workdir": w}, f"c{i}"))
                        for i, w in enumerate(workdirs)], response(assistant("Done.")))

        async def main():
            runner = FakeRunner()
            h = Harness(server, runner, tmp_path)
            await h.configure()
            sub_id = await h.say("go")
            assert tag(await h.done(sub_id)) == "task_complete"
            return h, runner

        h, runner = asyncio.run(main())
    cwd = str(h.cwd)
    assert [(r.cwd, r.sandbox_cwd) for r in runner.runs] == [
        ("/", cwd), (str(tmp_path), cwd), (f"{cwd}/.git", cwd), (str(tmp_path), cwd)]


# -- resolve_workdir --------------------------------------------------------------------


def test_resolve_workdir_resolves_against_the_session_cwd(tmp_path) -> None:
    cwd = tmp_path / "a" / "ws"
    (cwd / ".git").mkdir(parents=True)
    (cwd / "sub").mkdir()
    (cwd / "link").symlink_to(tmp_path)
    s = str(cwd)
    assert resolve_workdir(s, None) == s and resolve_workdir(s, "") == s
    assert resolve_workdir(s, ".") == s
    assert resolve_workdir(s, "sub") == f"{s}/sub" and resolve_workdir(s, "sub/") == f"{s}/sub"
    assert resolve_workdir(s, ".git") == f"{s}/.git"
    assert resolve_workdir(s, "..") == str(tmp_path / "a")
    assert resolve_workdir(s, "../..") == str(tmp_path)
    assert resolve_workdir(s, "sub/../../ws") == s
    assert resolve_workdir(s, "/") == "/" and resolve_workdir(s, "/var/tmp") == "/var/tmp"
    assert resolve_workdir(s, "//var//tmp/") == "/var/tmp"
    assert resolve_workdir(s, str(tmp_path)) == str(tmp_path)
    # Where it runs only; a symlink is not followed into a root of any kind.
    assert resolve_workdir(s, "link") == f"{s}/link"


def test_resolve_workdir_refuses_what_is_not_a_directory(tmp_path) -> None:
    s = str(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    cases = [("missing", "does not exist"), ("missing/deeper", "does not exist"), ("file", "is not a directory"),
             ("dangling", "does not exist"), ("file/x", "cannot be used"), ("a\0b", "contains a NUL byte")]
    for workdir, why in cases:
        with pytest.raises(WorkdirError, match=why):
            resolve_workdir(s, workdir)
    with pytest.raises(WorkdirError) as err:
        resolve_workdir(s, "missing")
    assert str(err.value) == f"workdir 'missing' does not exist ({s}/missing)"

