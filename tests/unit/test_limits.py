"""landlock_helper.limits and the limits' way through the wire, the client, the CLI's
config and the agent: parsing, defaults, what is reported, where cgroups are made."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import time

import msgspec
import pytest

from broker.cli.config import ConfigError, load_config
from broker.client import UsageError, make_request
from broker.wire import frames as wire
from broker.wire.protocol import AskForApproval, ConfigureSession, ModelProviderInfo, encode_json
from landlock_helper import limits as L
from tests.support.fake_model import FakeExec, FakeRunner, Harness, assistant, call, outputs_of, response

MiB = 1 << 20
GiB = 1 << 30


# -- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [
    ("512M", 512 * MiB), ("512m", 512 * MiB), ("1G", GiB), ("1g", GiB), ("1.5G", GiB + GiB // 2),
    ("64MiB", 64 * MiB), ("64mb", 64 * MiB), ("64k", 64 << 10), ("4096", 4096), ("4096b", 4096), ("2 G", 2 * GiB),
    ("0", 0), ("unlimited", 0), ("none", 0), ("-1", 0), (100, 100), (0, 0),
])
def test_sizes_read_as_docker_writes_them(text, value):
    assert L.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "1x", "G", "1.2.3G", "-5M", "12 parsecs", True])
def test_sizes_that_do_not_parse_say_so(text):
    with pytest.raises(L.LimitError, match="memory: "):
        L.parse_size(text, "memory")


def test_counts_and_durations():
    assert [L.parse_count(x) for x in ("256", 256, "-1", -1, "unlimited", "0")] == [256, 256, 0, 0, 0, 0]
    assert [L.parse_duration(x) for x in ("60", "60s", "5m", "1h", 90, "none")] == [60, 60, 300, 3600, 90, 0]
    for bad in ("many", "1.5", -2):
        with pytest.raises(L.LimitError):
            L.parse_count(bad)
    with pytest.raises(L.LimitError, match="not a duration"):
        L.parse_duration("1y")


def test_limits_refuse_nonsense_values():
    with pytest.raises(L.LimitError, match="pids limit must be a whole number"):
        L.Limits(pids=-3)
    with pytest.raises(L.LimitError):
        L.Limits(memory="1G")  # type: ignore[arg-type]
    with pytest.raises(L.LimitError):
        L.Limits(file_size=True)  # type: ignore[arg-type]


def test_sizes_for_a_person():
    assert [L.format_size(n) for n in (512 * MiB, GiB, GiB + GiB // 2, 64 << 10, 100)] == [
        "512 MiB", "1 GiB", "1.5 GiB", "64 KiB", "100 bytes"]


def test_config_table_with_docker_and_toml_spellings():
    got = L.from_table({"memory": "2G", "pids-limit": 256, "file_size": "1G", "cpu-time": "5m"})
    assert got == L.Limits(memory=2 * GiB, pids=256, file_size=GiB, cpu_time=300)
    with pytest.raises(L.LimitError, match=r"limits\.swap: unknown limit") as e:
        L.from_table({"swap": "1G"})
    assert e.value.key == "swap"
    with pytest.raises(L.LimitError, match="must be a table"):
        L.from_table(["memory"])


# -- defaults and resolution -----------------------------------------------------------


def test_defaults_and_what_overrides_them():
    d = L.defaults()
    assert d.pids == 1024 and d.file_size == 8 * GiB and d.cpu_time == 0
    assert d.memory == int(L.total_memory() * 0.5) > 0
    got = L.resolve(L.Limits(memory=64 * MiB, cpu_time=0))
    assert got == L.Limits(memory=64 * MiB, pids=1024, file_size=8 * GiB, cpu_time=0)
    assert L.resolve(None) == d
    assert L.Limits(pids=5).merged(L.Limits(memory=1)) == L.Limits(memory=1, pids=5)
    assert "memory 64 MiB, pids 1024, file size 8 GiB, CPU time none" == got.describe()


def test_rlimits_memory_and_processes_only_when_asked_and_not_covered():
    res = L.resolve(L.Limits(cpu_time=60))
    plan = L.plan_rlimits(res, (), as_root=True, asked=L.Limits(cpu_time=60))
    assert plan == [(resource.RLIMIT_FSIZE, 8 * GiB, 8 * GiB), (resource.RLIMIT_CPU, 60, 60 + L.CPU_GRACE_S)]
    asked = L.Limits(memory=64 * MiB, pids=64)
    res = L.resolve(asked)
    plan = L.plan_rlimits(res, (), as_root=False, asked=asked)
    assert (resource.RLIMIT_AS, 64 * MiB, 64 * MiB) in plan and (resource.RLIMIT_NPROC, 64, 64) in plan
    # As root the kernel does not count processes against RLIMIT_NPROC: not set at all.
    assert all(r != resource.RLIMIT_NPROC for r, _, _ in L.plan_rlimits(res, (), as_root=True, asked=asked))
    # Unlimited means no rlimit.
    assert L.plan_rlimits(L.Limits(0, 0, 0, 0), (), as_root=False, asked=L.Limits(0, 0, 0, 0)) == []


def test_apply_rlimits_never_raises_a_hard_limit(monkeypatch):
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda r: (100, 200))
    monkeypatch.setattr(resource, "setrlimit", lambda r, v: calls.append((r, v)))
    L.apply_rlimits([(resource.RLIMIT_CPU, 500, 502), (resource.RLIMIT_FSIZE, 50, 50)])
    assert calls == [(resource.RLIMIT_CPU, (200, 200)), (resource.RLIMIT_FSIZE, (50, 50))]


def test_what_was_hit():
    lim = L.Limits(memory=512 * MiB, pids=256, file_size=GiB, cpu_time=60)
    assert L.what_hit(lim, {"oom_kill": 1, "pids_max": 3}, signal.SIGKILL) == "killed: memory limit 512 MiB reached"
    assert L.what_hit(lim, None, signal.SIGXCPU) == "killed: CPU time limit 60 s reached"
    assert L.what_hit(lim, {}, signal.SIGXFSZ) == "killed: file size limit 1 GiB reached"
    assert L.what_hit(lim, {"pids_max": 1}, None) == "pids limit 256 reached (1 fork refused)"
    assert L.what_hit(lim, {"oom_kill": 0, "pids_max": 0}, signal.SIGTERM) is None
    # A signal that matches a limit not set is not blamed on it.
    assert L.what_hit(L.Limits(0, 0, 0, 0), {}, signal.SIGXCPU) is None


def test_counters_are_read_from_the_event_files(tmp_path):
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n")
    (tmp_path / "pids.events").write_text("max 3\n")
    assert L._field(str(tmp_path / "memory.events"), "oom_kill") == 2
    assert L._field(str(tmp_path / "pids.events"), "max") == 3
    # Relative to an open parent, as the supervisor reads them once the view has changed.
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert L._field("memory.events", "max", fd) == 7
    finally:
        os.close(fd)
    # Missing file or key, or a value that is not a number: nothing counted.
    assert L._field(str(tmp_path / "absent"), "max") == 0
    assert L._field(str(tmp_path / "pids.events"), "oom_kill") == 0
    (tmp_path / "pids.events").write_text("max x\n")
    assert L._field(str(tmp_path / "pids.events"), "max") == 0

# -- finding cgroups ---------------------------------------------------------------------


def _tree(base, files: dict[str, str]):
    for rel, text in files.items():
        path = os.path.join(base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def test_v2_uses_the_nearest_writable_cgroup_that_delegates_the_controllers(tmp_path):
    base = str(tmp_path)
    # We live in /a/b (processes: no controllers for its children); /a gives them to its children.
    _tree(base, {
        "cgroup.controllers": "cpu memory pids io\n",
        "a/cgroup.subtree_control": "memory pids\n", "a/cgroup.procs": "",
        "a/b/cgroup.subtree_control": "", "a/b/cgroup.procs": "1\n",
        # What the kernel would make with the mkdir of a/sluice.
        "a/sluice/cgroup.subtree_control": "",
    })
    h, why = L._v2_parent(base, "/", "/a/b", ["memory", "pids"])
    assert why == "" and h.version == 2 and h.parent == os.path.join(base, "a", "sluice")
    assert h.controllers == ("memory", "pids")
    with open(os.path.join(base, "a/sluice/cgroup.subtree_control")) as f:
        assert f.read() == "+memory +pids"


def test_v2_without_the_controllers_falls_back(tmp_path):
    base = str(tmp_path)
    _tree(base, {"cgroup.controllers": "", "a/cgroup.subtree_control": ""})
    assert L._v2_parent(base, "/", "/a", ["memory", "pids"]) == (None, "")  # an empty hybrid mount
    _tree(base, {"cgroup.controllers": "memory pids", "cgroup.subtree_control": ""})
    h, why = L._v2_parent(base, "/", "/a", ["memory", "pids"])
    assert h is None and "no writable cgroup v2" in why


def test_cgroup_paths_under_mounts_of_part_of_the_hierarchy():
    assert L._local("/sys/fs/cgroup/memory", "/", "/x/y") == "/sys/fs/cgroup/memory/x/y"
    assert L._local("/sys/fs/cgroup", "/docker/abc", "/docker/abc/sub") == "/sys/fs/cgroup/sub"
    assert L._local("/sys/fs/cgroup", "/docker/abc", "/elsewhere") is None
    assert L._local("/sys/fs/cgroup", "/", "/gone (deleted)") is None


def test_stale_cgroups_of_gone_processes_are_swept(tmp_path):
    parent = tmp_path / "sluice"
    parent.mkdir()
    old = time.time() - 60
    names = {"dead": "99999999-3-abcdef", "mine": f"{os.getpid()}-1-abcdef", "alive": "1-2-abcdef",
             "busy": "99999998-1-abcdef", "young": "99999997-1-abcdef", "other": "unrelated"}
    for key, name in names.items():
        (parent / name).mkdir()
        if key == "busy":
            (parent / name / "cgroup.procs").write_text("")  # rmdir fails, as on a populated cgroup
        if key != "young":
            os.utime(parent / name, (old, old))
    mech = L.Mechanism(hierarchies=(L._Hierarchy(1, str(parent), ("pids",)),))
    assert L.sweep_stale(mech) == 1
    assert sorted(os.listdir(parent)) == sorted(n for k, n in names.items() if k != "dead")


def test_no_cgroups_when_told_so(monkeypatch):
    monkeypatch.setenv("SLUICE_NO_CGROUPS", "1")
    mech = L._detect()
    assert mech.hierarchies == () and "SLUICE_NO_CGROUPS" in mech.reason
    text = mech.describe()
    assert "memory: RLIMIT_AS when asked" in text and "file size: RLIMIT_FSIZE" in text
    assert "cpu: shared per process" in text


# -- the wire, the client, the config ------------------------------------------------------


def test_limits_cross_the_wire():
    req = wire.RunRequest(argv=["true"], cwd="/", sandbox=make_request(["true"], cwd="/tmp").sandbox,
                          limits=L.Limits(memory=64 * MiB, pids=64))
    back = wire.decode(wire.RUN, wire.encode(req))
    assert back.limits == L.Limits(memory=64 * MiB, pids=64) and isinstance(back.limits, L.Limits)
    raw = msgspec.msgpack.encode({"argv": ["true"], "cwd": "/", "sandbox": msgspec.to_builtins(req.sandbox),
                                  "limits": {"pids": -5}})
    with pytest.raises(wire.WireError, match="pids"):
        wire.decode(wire.RUN, raw)
    status = wire.decode(wire.EXIT, wire.encode(wire.ExitStatus(signal=9, limit="killed: memory limit 1 GiB reached")))
    assert status.limit == "killed: memory limit 1 GiB reached" and status.returncode == 137


def test_make_request_reads_limits_as_docker_spells_them():
    req = make_request(["true"], cwd="/tmp", memory="512M", pids_limit=256, file_size="1G", cpu_time=60)
    assert req.limits == L.Limits(memory=512 * MiB, pids=256, file_size=GiB, cpu_time=60)
    assert make_request(["true"], cwd="/tmp").limits is None
    # Arguments beat a configuration's limits; what they leave unset, it keeps.
    req = make_request(["true"], cwd="/tmp", memory="1G", limits=L.Limits(memory=2 * GiB, pids=10))
    assert req.limits == L.Limits(memory=GiB, pids=10)
    assert make_request(["true"], cwd="/tmp", pids_limit=-1).limits == L.Limits(pids=0)
    with pytest.raises(UsageError, match="memory: not a size"):
        make_request(["true"], cwd="/tmp", memory="lots")
    with pytest.raises(UsageError, match="limits must be"):
        make_request(["true"], cwd="/tmp", limits={"memory": 1})  # type: ignore[arg-type]


def test_agent_config_limits_table(tmp_path):
    home = {"SLUICE_HOME": str(tmp_path)}
    (tmp_path / "config.toml").write_text('model = "m"\n\n[limits]\nmemory = "2G"\npids = 512\n')
    assert load_config(env=home).limits == L.Limits(memory=2 * GiB, pids=512)
    assert load_config(env=home, overrides=["limits.cpu_time=30"]).limits.cpu_time == 30
    (tmp_path / "config.toml").write_text('[limits]\nmemory = "2X"\n')
    with pytest.raises(ConfigError, match=r"config.toml:2: limits\.memory: not a size: '2X'"):
        load_config(env=home)
    (tmp_path / "config.toml").write_text("")
    assert load_config(env=home).limits == L.Limits()


def test_configure_session_carries_limits_and_stays_codex_shaped_without():
    op = ConfigureSession(provider=ModelProviderInfo(name="x", base_url="http://h"), model="m",
                          approval_policy=AskForApproval.NEVER, sandbox_policy=make_request(["t"], cwd="/tmp").sandbox,
                          cwd="/", limits=L.Limits(memory=GiB))
    text = encode_json(op)
    assert b'"limits":{"memory":1073741824' in text
    assert msgspec.json.decode(text, type=ConfigureSession).limits == L.Limits(memory=GiB)
    assert b"limits" not in encode_json(msgspec.structs.replace(op, limits=msgspec.UNSET))


# -- the agent --------------------------------------------------------------------------


def test_agent_sends_the_sessions_limits_and_tells_the_model_what_was_hit(server, tmp_path):
    server.script(
        response(call("shell", {"command": ["make"]}, "c1")),
        response(assistant("Out of memory.")),
    )

    async def main():
        runner = FakeRunner(lambda argv, sandboxed: FakeExec(stderr="", exit_code=None, limit=(
            "killed: memory limit 512 MiB reached")))
        h = Harness(server, runner, tmp_path)
        await h.configure(limits=L.Limits(memory=512 * MiB))
        sub_id = await h.say("build")
        await h.done(sub_id)
        assert runner.runs[0].limits == L.Limits(memory=512 * MiB)
        end = h.of("exec_command_end")[0]
        assert "sluice: killed: memory limit 512 MiB reached" in end.stderr

    asyncio.run(main())
    assert "killed: memory limit 512 MiB reached" in outputs_of(server.requests[1]["json"])["c1"]
