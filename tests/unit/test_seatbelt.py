"""The macOS Seatbelt profile, checked as text on any platform.

The profile is parsed into s-expressions and a small evaluator answers "would this
operation on this path be allowed?" with SBPL's rule (default deny, the last matching
rule wins), so the tests follow what the profile means rather than how it is spelled.
"""

from __future__ import annotations

import os
import re

import pytest

from landlock_helper.policy import (
    FULL_READ,
    FULL_WRITE,
    USER_TEMP,
    WRITE_CWD,
    Permission,
    PolicyError,
    SandboxPolicy,
)
from landlock_helper.seatbelt import SANDBOX_EXEC, seatbelt_argv, seatbelt_profile

pytestmark = pytest.mark.timeout(30)


# -- a tiny SBPL reader ------------------------------------------------------------------


class Str(str):
    """A string literal."""


class Regex(str):
    """A #"..." regex literal."""


_TOKEN = re.compile(r'\s+|;[^\n]*|\(|\)|#"(?:[^"\\]|\\.)*"|"(?:[^"\\]|\\.)*"|[^\s()";]+')


def parse(text: str) -> list:
    stack: list[list] = [[]]
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m, f"unparseable profile near {text[pos:pos + 40]!r}"
        tok = m.group()
        pos = m.end()
        if tok.isspace() or tok.startswith(";"):
            continue
        if tok == "(":
            stack.append([])
        elif tok == ")":
            assert len(stack) > 1, "unbalanced ')'"
            done = stack.pop()
            stack[-1].append(done)
        elif tok.startswith('#"'):
            stack[-1].append(Regex(tok[2:-1].replace('\\"', '"')))
        elif tok.startswith('"'):
            stack[-1].append(Str(tok[1:-1].replace('\\"', '"').replace("\\\\", "\\")))
        else:
            stack[-1].append(tok)
    assert len(stack) == 1, "unbalanced '('"
    return stack[0]


def params_dict(args: list[str]) -> dict[str, str]:
    out = {}
    for arg in args:
        assert arg.startswith("-D"), arg
        name, sep, value = arg[2:].partition("=")
        assert sep and re.fullmatch(r"[A-Z][A-Z0-9_]*", name), arg
        assert name not in out, f"parameter {name} defined twice"
        out[name] = value
    return out


def rules(forms: list) -> list[tuple[str, list[str], list]]:
    """Top-level (allow|deny op... filter...) forms as (action, ops, filters)."""
    out = []
    for form in forms:
        if isinstance(form, list) and form and form[0] in ("allow", "deny"):
            ops = [x for x in form[1:] if isinstance(x, str) and not isinstance(x, (Str, Regex))]
            filters = [x for x in form[1:] if isinstance(x, list)]
            out.append((form[0], ops, filters))
    return out


def op_matches(rule_op: str, op: str) -> bool:
    if rule_op == "default" or rule_op == op:
        return True
    return rule_op.endswith("*") and op.startswith(rule_op[:-1])


def value(expr, params: dict[str, str]) -> str:
    if isinstance(expr, list) and expr[0] == "param":
        assert expr[1] in params, f"profile uses undefined parameter {expr[1]}"
        return params[expr[1]]
    assert isinstance(expr, Str), f"expected a string, got {expr!r}"
    return str(expr)


def filter_matches(f, query: dict, params: dict[str, str]) -> bool:
    head = f[0]
    if head == "require-all":
        return all(filter_matches(g, query, params) for g in f[1:])
    if head == "require-any":
        return any(filter_matches(g, query, params) for g in f[1:])
    if head == "require-not":
        return not filter_matches(f[1], query, params)
    if head in ("remote", "local"):
        side = query.get("socket")
        if side is None or side[0] != head or f[1] != "unix-socket":
            return False
        return filter_matches(f[2], {"path": side[1]}, params)
    path = query.get("path")
    if path is None:
        return False
    if head == "literal":
        return path == value(f[1], params)
    if head == "subpath":
        base = value(f[1], params).rstrip("/")
        return path == base or path.startswith(base + "/") or base == ""
    if head == "regex":
        return re.search(f[1], path) is not None
    # extension, target, sysctl-name, global-name ...: never a plain path match
    return False


def decide(profile: str, args: list[str], op: str, path: str | None = None, socket=None) -> str:
    params = params_dict(args)
    decision = "deny"
    query = {"path": path, "socket": socket}
    for action, ops, filters in rules(parse(profile)):
        if not any(op_matches(o, op) for o in ops):
            continue
        if not filters or any(filter_matches(f, query, params) for f in filters):
            decision = action
    return decision


def can_read(profile, args, path):
    return decide(profile, args, "file-read-data", path) == "allow"


def can_write(profile, args, path):
    return decide(profile, args, "file-write-data", path) == "allow" and (
        decide(profile, args, "file-write-create", path) == "allow"
    )


def can_unlink(profile, args, path):
    return decide(profile, args, "file-write-unlink", path) == "allow"


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path):
    """A project with .git and .sluice, and a separate TMPDIR."""
    proj = tmp_path / "proj"
    (proj / ".git" / "hooks").mkdir(parents=True)
    (proj / ".sluice").mkdir()
    (proj / "src").mkdir()
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    return str(proj), {"TMPDIR": str(tmpdir)}


def workspace(**kw) -> SandboxPolicy:
    return SandboxPolicy.from_mode("workspace-write", **kw)


READ_ONLY = SandboxPolicy.from_mode("read-only")


# -- structure -------------------------------------------------------------------------


def test_profile_starts_closed():
    profile, args = seatbelt_profile(READ_ONLY, "/work")
    forms = parse(profile)
    assert forms[0] == ["version", "1"]
    assert forms[1] == ["deny", "default"]
    assert ["allow", "default"] not in forms
    assert args == []


def test_every_parameter_is_defined_and_used(project):
    cwd, env = project
    profile, args = seatbelt_profile(
        workspace(network=True, writable_roots=["/srv/out"]), cwd, env, hidden_paths=["/run/s"]
    )
    used = set(re.findall(r'\(param "([A-Z0-9_]+)"\)', profile))
    defined = set(params_dict(args))
    assert used == defined
    assert len(defined) >= 6


def test_argv_shape(project):
    cwd, env = project
    argv = seatbelt_argv(["sh", "-c", "echo -- hi"], workspace(), cwd, env, ["/run/s"])
    profile, args = seatbelt_profile(workspace(), cwd, env, ["/run/s"])
    assert argv[:3] == [SANDBOX_EXEC, "-p", profile]
    assert SANDBOX_EXEC == "/usr/bin/sandbox-exec"
    sep = argv.index("--")
    assert argv[3:sep] == args
    assert argv[sep + 1 :] == ["sh", "-c", "echo -- hi"]


def test_danger_full_access_is_not_wrapped(project):
    cwd, env = project
    cmd = ["rm", "-rf", "build"]
    out = seatbelt_argv(cmd, SandboxPolicy.from_mode("danger-full-access"), cwd, env, ["/run/s"])
    assert out == cmd and out is not cmd
    assert SANDBOX_EXEC not in out


def test_relative_paths_are_refused():
    with pytest.raises(PolicyError):
        seatbelt_profile(READ_ONLY, "relative/dir")
    with pytest.raises(PolicyError):
        seatbelt_profile(READ_ONLY, "/work", hidden_paths=["run/sluice"])


# -- reads and writes -------------------------------------------------------------------


def test_read_only_reads_everything_writes_nothing(project):
    cwd, env = project
    profile, args = seatbelt_profile(READ_ONLY, cwd, env)
    assert "(allow file-read*)" in profile
    for path in ("/etc/passwd", "/usr/bin/true", cwd + "/src/a.py", "/Users/me/.ssh/id_rsa"):
        assert can_read(profile, args, path), path
    for path in (cwd + "/src/a.py", cwd, "/tmp/x", env["TMPDIR"] + "/x", "/private/tmp/x"):
        assert not can_write(profile, args, path), path
        assert not can_unlink(profile, args, path), path
    assert decide(profile, args, "file-write-data", "/dev/null") == "allow"
    assert args == []


def test_read_only_write_rules_only_name_devices():
    profile, _ = seatbelt_profile(READ_ONLY, "/work")

    def device_only(f) -> bool:
        if f[0] in ("require-all", "require-any"):
            return any(device_only(g) for g in f[1:])
        if f[0] == "literal":
            return isinstance(f[1], Str) and f[1].startswith("/dev/")
        if f[0] == "regex":
            return f[1].startswith("^/dev/")
        return False

    write_allows = [
        (ops, filters)
        for action, ops, filters in rules(parse(profile))
        if action == "allow" and any(o.startswith("file-write") for o in ops)
    ]
    assert write_allows, "expected at least the /dev/null rule"
    for ops, filters in write_allows:
        assert filters, f"unfiltered write rule {ops}"
        for f in filters:
            assert device_only(f), f"write rule reaches beyond devices: {f}"


def test_workspace_write_roots_are_params_and_subpaths(project):
    cwd, env = project
    policy = workspace(writable_roots=["/srv/out"])
    profile, args = seatbelt_profile(policy, cwd, env)
    params = params_dict(args)
    write_subpaths = {
        params[f[1][1]]
        for action, ops, filters in rules(parse(profile))
        if action == "allow" and "file-write*" in ops
        for f in filters
        if f[0] == "subpath" and isinstance(f[1], list)
    }
    for root in (cwd, "/tmp", env["TMPDIR"], "/srv/out"):
        assert root in params.values(), root
        assert root in write_subpaths, root
        assert can_write(profile, args, os.path.join(root, "new-file")), root
    for path in ("/etc/hosts", "/srv/outside", "/srv", "/var/tmp/x"):
        assert not can_write(profile, args, path), path


def test_cwd_only_does_not_reach_its_siblings(project):
    cwd, env = project
    policy = SandboxPolicy.of([Permission(FULL_READ), Permission(WRITE_CWD)])
    profile, args = seatbelt_profile(policy, cwd, env)
    assert list(params_dict(args).values())[0] == cwd
    assert can_write(profile, args, cwd + "/src/x.py")
    outside = (os.path.dirname(cwd) + "/sibling", cwd + "-suffix", "/tmp/x", env["TMPDIR"] + "/x")
    for path in outside:
        assert not can_write(profile, args, path), path


def test_git_and_sluice_stay_read_only(project):
    cwd, env = project
    profile, args = seatbelt_profile(workspace(), cwd, env)
    for path in (".git", ".git/config", ".git/hooks/pre-commit", ".sluice", ".sluice/config.toml"):
        full = os.path.join(cwd, path)
        assert can_read(profile, args, full), path
        assert not can_write(profile, args, full), path
        assert not can_unlink(profile, args, full), path  # no rename/remove of .git
    # Only the entries themselves: look-alike names stay writable.
    for path in (".gitignore", ".github/workflows/ci.yml", "src/.git-blame-ignore", ".sluice2"):
        assert can_write(profile, args, os.path.join(cwd, path)), path
    values = params_dict(args).values()
    assert os.path.join(cwd, ".git") in values
    assert os.path.join(cwd, ".sluice") in values


def test_missing_git_is_not_a_parameter(tmp_path):
    # Roots of the test's own only: the global temp folder (/tmp) may hold a .git that
    # another program made, and would rightly be protected.
    policy = SandboxPolicy.of([FULL_READ, USER_TEMP, WRITE_CWD])
    profile, args = seatbelt_profile(policy, str(tmp_path), {"TMPDIR": str(tmp_path)})
    roots = {v for k, v in params_dict(args).items() if k.startswith("WRITABLE_ROOT_")}
    assert roots and roots <= {str(tmp_path), os.path.realpath(tmp_path)}
    assert not any(".git" in a or ".sluice" in a for a in args)
    assert "READ_ONLY" not in profile


def test_git_protected_when_project_lies_inside_another_root(project, tmp_path):
    cwd, env = project
    # $TMPDIR is an ancestor of the project: its rule alone would allow .git writes.
    env = {"TMPDIR": str(tmp_path)}
    profile, args = seatbelt_profile(workspace(), cwd, env)
    assert not can_write(profile, args, cwd + "/.git/hooks/pre-commit")
    # Nor may the project be renamed away from its protected path and back.
    assert not can_unlink(profile, args, cwd)
    assert decide(profile, args, "file-write-create", cwd) == "deny"
    assert can_write(profile, args, cwd + "/src/main.py")
    assert can_unlink(profile, args, cwd + "/src")
    assert can_write(profile, args, str(tmp_path / "elsewhere.txt"))


def test_symlinked_root_gets_both_spellings(tmp_path):
    real = tmp_path / "real"
    (real / ".git").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    profile, args = seatbelt_profile(workspace(), str(link), {"TMPDIR": str(tmp_path / "t")})
    values = list(params_dict(args).values())
    assert str(link) in values and str(real) in values
    # Seatbelt checks resolved paths: the real spelling is the one that must work.
    assert can_write(profile, args, str(real / "f"))
    assert not can_write(profile, args, str(real / ".git" / "config"))
    assert not can_write(profile, args, str(link / ".git" / "config"))


def test_full_write_without_network(project):
    cwd, env = project
    policy = SandboxPolicy.of([Permission(FULL_READ), Permission(FULL_WRITE)])
    profile, args = seatbelt_profile(policy, cwd, env, hidden_paths=["/run/sluice"])
    assert can_write(profile, args, "/etc/anything")
    assert not can_write(profile, args, "/run/sluice/token")
    assert decide(profile, args, "network-outbound", socket=("remote", "/var/run/x.sock")) == "deny"


def test_without_full_read_only_system_and_roots_are_readable(project):
    cwd, env = project
    policy = SandboxPolicy.of([Permission(WRITE_CWD)])
    profile, args = seatbelt_profile(policy, cwd, env)
    assert "(allow file-read*)" not in profile
    assert can_read(profile, args, "/usr/lib/libSystem.B.dylib")
    assert can_read(profile, args, cwd + "/src/a.py")
    assert not can_read(profile, args, "/Users/me/.ssh/id_rsa")
    assert not can_write(profile, args, "/tmp/x")


# -- hidden paths ----------------------------------------------------------------------------


def test_hidden_path_denied_after_all_allows(project, tmp_path):
    cwd, env = project
    runtime = str(tmp_path / "tmpdir" / "sluice")  # inside the writable $TMPDIR
    for policy in (READ_ONLY, workspace(), workspace(network=True)):
        profile, args = seatbelt_profile(policy, cwd, env, hidden_paths=[runtime])
        for path in (runtime, runtime + "/auth-token", runtime + "/broker.sock"):
            assert not can_read(profile, args, path), (policy.mode, path)
            assert decide(profile, args, "file-read-metadata", path) == "deny"
            assert not can_write(profile, args, path), (policy.mode, path)
        sock = runtime + "/broker.sock"
        assert decide(profile, args, "network-outbound", socket=("remote", sock)) == "deny"
        assert decide(profile, args, "network-bind", socket=("local", sock)) == "deny"
        # The deny rules come after every allow (SBPL: the last match wins).
        rs = rules(parse(profile))
        hidden_name = next(k for k, v in params_dict(args).items() if v == runtime)
        deny_at = min(i for i, r in enumerate(rs) if hidden_name in repr(r) and r[0] == "deny")
        last_allow = max(i for i, r in enumerate(rs) if r[0] == "allow")
        assert deny_at > last_allow
        # The neighbours of the hidden dir are untouched.
        assert can_read(profile, args, runtime + "-other")


def test_hidden_symlink_gets_resolved_spelling(tmp_path):
    real = tmp_path / "run-real"
    real.mkdir()
    link = tmp_path / "run-link"
    link.symlink_to(real)
    profile, args = seatbelt_profile(READ_ONLY, "/work", hidden_paths=[str(link)])
    assert not can_read(profile, args, str(real / "auth-token"))
    assert not can_read(profile, args, str(link / "auth-token"))


# -- network -------------------------------------------------------------------------------


def _network_allows(profile: str) -> list[tuple[list[str], list]]:
    return [
        (ops, filters)
        for action, ops, filters in rules(parse(profile))
        if action == "allow" and any(o.startswith(("network", "system-socket")) for o in ops)
    ]


def test_network_rules_only_with_network(project):
    cwd, env = project
    off, off_args = seatbelt_profile(workspace(), cwd, env)
    on, on_args = seatbelt_profile(workspace(network=True), cwd, env)

    for op in ("network-outbound", "network-inbound", "network-bind"):
        assert decide(on, on_args, op) == "allow", op
        assert decide(off, off_args, op) == "deny", op
    assert "(allow network-outbound)" in on
    assert "(allow network-inbound)" in on
    assert "(allow system-socket)" in on

    # Without network the only socket rule is creating AF_UNIX sockets (socketpair).
    allows = _network_allows(off)
    assert allows == [(["system-socket"], [["socket-domain", "AF_UNIX"]])]
    for sock in (cwd + "/app.sock", "/var/run/docker.sock", "/tmp/ssh-agent.sock"):
        assert decide(off, off_args, "network-outbound", socket=("remote", sock)) == "deny"
        assert decide(off, off_args, "network-bind", socket=("local", sock)) == "deny"
    assert "network-outbound" not in off and "network-inbound" not in off


def test_dns_and_tls_services_only_with_network(project):
    cwd, env = project
    off, _ = seatbelt_profile(workspace(), cwd, env)
    on, _ = seatbelt_profile(workspace(network=True), cwd, env)
    for service in ("com.apple.SystemConfiguration.configd", "com.apple.trustd.agent"):
        assert service in on
        assert service not in off


# -- injection -------------------------------------------------------------------------------


def test_hostile_paths_only_travel_as_parameters(tmp_path):
    evil_cwd = tmp_path / 'INJECT") (allow default) (deny file-read* (subpath "/'
    (evil_cwd / ".git").mkdir(parents=True)
    evil_root = '/srv/INJECT_ROOT")))\n(allow file-write* (subpath "/'
    evil_tmp = str(tmp_path / 'INJECT_TMP;")')
    evil_hidden = '/run/INJECT_HIDDEN" ) ( allow file-read*'
    policy = workspace(writable_roots=[evil_root], network=False)
    profile, args = seatbelt_profile(
        policy, str(evil_cwd), {"TMPDIR": evil_tmp}, hidden_paths=[evil_hidden]
    )
    assert "INJECT" not in profile
    assert "(allow default)" not in profile
    forms = parse(profile)  # still well formed
    assert forms[1] == ["deny", "default"]
    values = params_dict(args).values()
    for path in (str(evil_cwd), os.path.normpath(evil_root), evil_tmp, evil_hidden):
        assert path in values, path
    # ... and they mean what they say: no more, no less.
    assert can_write(profile, args, os.path.normpath(evil_root) + "/f")
    assert not can_write(profile, args, "/etc/passwd")
    assert not can_write(profile, args, str(evil_cwd / ".git" / "config"))
    assert not can_read(profile, args, evil_hidden + "/auth-token")
    argv = seatbelt_argv(["true"], policy, str(evil_cwd), {"TMPDIR": evil_tmp}, [evil_hidden])
    assert "INJECT" not in argv[2]
    assert [a for a in argv if "INJECT" in a] == [a for a in args if "INJECT" in a]
