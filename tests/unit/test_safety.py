"""Known-safe commands, the approval decision table, patch safety, sandbox denials."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import pytest

from agent.safe_commands import PlainCommand, is_known_safe_command, parse_plain_script
from agent.safety import (
    RETRY_WITHOUT_SANDBOX_REASON,
    AskUser,
    AutoApprove,
    Reject,
    assess_command_safety,
    assess_patch_safety,
    input_needs_approval,
    is_likely_sandbox_denied,
    is_path_writable,
    should_report_denial,
    should_retry_unsandboxed,
    writable_roots_for,
)
from broker.wire.protocol import AskForApproval
from landlock_helper.policy import SandboxPolicy
from tests.support.shell_cases import PARSED

UNTRUSTED, ON_FAILURE, ON_REQUEST, NEVER = (
    AskForApproval.UNTRUSTED,
    AskForApproval.ON_FAILURE,
    AskForApproval.ON_REQUEST,
    AskForApproval.NEVER,
)
READ_ONLY = SandboxPolicy.from_mode("read-only")
WORKSPACE = SandboxPolicy.from_mode("workspace-write")
WORKSPACE_NET = SandboxPolicy.from_mode("workspace-write", network=True)
FULL = SandboxPolicy.from_mode("danger-full-access")


def bash(script: str) -> list[str]:
    return ["bash", "-lc", script]


# -- known-safe commands --------------------------------------------------------------

SAFE = [
    ["ls"],
    ["ls", "-la", "/etc"],
    ["cat", "README.md"],
    ["cd", "src"],
    ["echo", "hello", "world"],
    ["grep", "-rn", "TODO", "."],
    ["head", "-n", "20", "f"],
    ["tail", "-f", "log"],
    ["wc", "-l", "f"],
    ["pwd"],
    ["true"],
    ["false"],
    ["nl", "-ba", "f"],
    ["which", "python3"],
    ["whoami"],
    ["id", "-u"],
    ["tr", "a-z", "A-Z"],
    ["cut", "-d:", "-f1", "/etc/passwd"],
    ["stat", "f"],
    ["uname", "-a"],
    ["seq", "10"],
    ["expr", "1", "+", "2"],
    ["sort", "-u", "f"],
    ["sort", "-t", "o", "-k", "2", "f"],
    ["sort", "--reverse", "f"],
    ["uniq", "-c", "f"],
    ["uniq", "-f", "1", "in"],
    ["uniq", "--skip-fields", "2", "in"],
    ["uniq", "-f1", "in"],
    ["file", "-b", "f"],
    ["base64", "-d", "f"],
    ["git", "status"],
    ["git", "status", "--porcelain"],
    ["git", "log", "--oneline", "-n", "5"],
    ["git", "diff", "HEAD~1"],
    ["git", "diff", "--output-indicator-new=+", "x"],
    ["git", "show", "HEAD:README.md"],
    ["git", "--no-pager", "log"],
    ["git", "branch"],
    ["git", "branch", "-a"],
    ["git", "branch", "-vv"],
    ["git", "branch", "--list", "feature/*"],
    ["git", "branch", "--show-current"],
    ["git", "branch", "--contains", "abc123"],
    ["git", "branch", "--format=%(refname)", "--sort=-committerdate"],
    ["find", ".", "-name", "*.py"],
    ["find", ".", "-type", "f", "-print"],
    ["rg", "-n", "pattern"],
    ["rg", "--files"],
    ["rg", "--pre-glob", "*.pdf", "x"],
    ["sed", "-n", "10p", "f.txt"],
    ["sed", "-n", "1,20p", "f.txt"],
    ["sed", "-n", "5p"],
    # shell scripts of plain, known-safe commands
    bash("ls"),
    bash("ls && pwd"),
    bash("ls || true"),
    bash("ls; pwd"),
    bash("ls;"),
    bash("git status | head -n 5"),
    bash("cat f | grep x | wc -l"),
    bash("ls\npwd\n"),
    bash("\n  ls -la  \n\n"),
    bash("ls &&\n  pwd"),
    bash("ls *.py"),
    bash("cat src/*.rs | wc -l"),
    bash("grep -rn 'hello world' ."),
    bash('grep -n "a b" f'),
    bash("echo 'single $HOME `x` $(y) > z'"),
    bash('echo "no \\$expansion \\`here\\`"'),
    bash("echo a\\ b"),
    bash("echo ok\\; rm x && ls"),  # the escaped ; is part of a word
    bash("echo 'it'\\''s'"),
    bash("echo foo\\\nbar"),
    bash("echo ~ ~/x"),
    bash("find . -name '*.py'"),
    bash('rg -n "fn main" src'),
    bash("sed -n 1,5p f"),
    bash("git log --oneline | head"),
    bash("grep 'a|b' f"),
    bash('echo "a;b && c"'),
    ["bash", "-c", "ls"],
    ["sh", "-c", "ls | wc -l"],
    ["zsh", "-lc", "ls"],
    ["/bin/bash", "-lc", "ls"],
    ["/usr/bin/sh", "-c", "pwd"],
]

UNSAFE = [
    [],
    [""],
    ["rm", "-rf", "x"],
    ["python3", "-c", "print(1)"],
    ["./ls"],
    ["/bin/ls"],
    ["/tmp/cat", "x"],
    ["cargo", "check"],
    ["tee", "out"],
    ["cp", "a", "b"],
    # find that runs, deletes or writes
    ["find", ".", "-delete"],
    ["find", ".", "-name", "x", "-exec", "rm", "{}", ";"],
    ["find", ".", "-execdir", "sh", "-c", "x", ";"],
    ["find", ".", "-ok", "rm", "{}", ";"],
    ["find", ".", "-okdir", "rm", "{}", ";"],
    ["find", ".", "-fls", "out"],
    ["find", ".", "-fprint", "out"],
    ["find", ".", "-fprint0", "out"],
    ["find", ".", "-fprintf", "out", "%p"],
    # rg that runs programs
    ["rg", "--pre", "x", "pattern"],
    ["rg", "--pre=x", "pattern"],
    ["rg", "--hostname-bin", "x", "p"],
    ["rg", "--hostname-bin=x", "p"],
    ["rg", "-z", "p"],
    ["rg", "--search-zip", "p"],
    ["rg", "-iz", "p"],
    # git that writes or runs
    ["git", "branch", "-D", "x"],
    ["git", "branch", "-d", "x"],
    ["git", "branch", "new-branch"],
    ["git", "branch", "-m", "a", "b"],
    ["git", "branch", "-M", "a"],
    ["git", "branch", "-c", "a", "b"],
    ["git", "branch", "--delete", "x"],
    ["git", "branch", "-u", "origin/x"],
    ["git", "branch", "--set-upstream-to=origin/x"],
    ["git", "branch", "-f", "x", "HEAD"],
    ["git", "branch", "-av", "x"],
    ["git", "branch", "--", "x"],
    ["git", "log", "--output=/tmp/x"],
    ["git", "diff", "--output", "f"],
    ["git", "diff", "--out=f"],
    ["git", "diff", "--ext-diff"],
    ["git", "show", "--output=f"],
    ["git", "commit", "-m", "x"],
    ["git", "checkout", "."],
    ["git", "push"],
    ["git", "-c", "core.pager=sh", "log"],
    ["git", "-C", "dir", "status"],
    ["git"],
    ["git", "--no-pager"],
    # sed beyond `-n Np`
    ["sed", "-i", "s/a/b/", "f"],
    ["sed", "-n", "1p", "-i", "f"],
    ["sed", "-n", "1p", ""],
    ["sed", "-n", "w out", "f"],
    ["sed", "-n", "1,5p;w x", "f"],
    ["sed", "s/a/b/", "f"],
    ["sed", "-n", "1p", "a", "b"],
    # sort / uniq / file / base64 that write or run
    ["sort", "-o", "out", "f"],
    ["sort", "-ro", "out", "f"],
    ["sort", "-oout", "f"],
    ["sort", "--output=out", "f"],
    ["sort", "--out=out", "f"],
    ["sort", "--compress-program=sh", "f"],
    ["sort", "-T", "/tmp", "f"],
    ["sort", "--temporary-directory=/tmp", "f"],
    ["uniq", "in", "out"],
    ["uniq", "-c", "in", "out"],
    ["uniq", "--", "in", "out"],
    ["file", "-C", "-m", "magic"],
    ["file", "--compile"],
    ["file", "-z", "f.gz"],
    ["file", "-Z", "f.gz"],
    ["base64", "-o", "out", "f"],
    ["base64", "--output=out", "f"],
    # shell scripts: redirections, substitutions, expansions, unknown commands
    bash("ls > out"),
    bash("ls >> out"),
    bash("ls 2> err"),
    bash("ls &> out"),
    bash("cat < in"),
    bash("cat <<EOF\nx\nEOF"),
    bash("echo $(rm -rf /)"),
    bash("echo `rm -rf /`"),
    bash('echo "$(rm -rf /)"'),
    bash('echo "`rm x`"'),
    bash("echo $HOME"),
    bash("echo ${HOME}"),
    bash('echo "$HOME"'),
    bash("echo $((1+2))"),
    bash("ls && rm x"),
    bash("ls; rm x"),
    bash("ls | xargs rm"),
    bash("ls || rm -rf ."),
    bash("ls\nrm x"),
    bash("(ls)"),
    bash("{ ls; }"),
    bash("ls &"),
    bash("ls & rm x"),
    bash("ls |& cat"),
    bash("! ls"),
    bash("ls # comment"),
    bash("FOO=1 ls"),
    bash("echo {a,b}"),
    bash("cat <(ls)"),
    bash("diff <(ls) <(ls)"),
    bash("find . -delete"),
    bash("find . *"),
    bash("find . -name x -exec rm {} \\;"),
    bash("rg --pre x p"),
    bash("git branch -D x"),
    bash("sort *.txt"),
    bash("git diff *"),
    bash("l? -la"),
    bash("sed -n 1p f -i"),
    bash("bash -lc ls"),
    bash("sh -c 'ls'"),
    # quoting edge cases and malformed scripts
    bash(""),
    bash("   "),
    bash("\n"),
    bash(";"),
    bash("; ls"),
    bash("ls ;; pwd"),
    bash("ls && "),
    bash("&& ls"),
    bash("ls | | wc"),
    bash("ls |"),
    bash("ls\n;"),
    bash("echo 'unterminated"),
    bash('echo "unterminated'),
    bash("echo \\"),
    bash("'rm' -rf x"),
    bash("r\\m -rf x"),
    bash("\"rm\" x"),
    bash("ls\x00rm"),
    bash("ls\rrm"),
    bash("ls\x1b"),
    ["bash", "-lc", "ls", "extra"],
    ["bash", "-l", "-c", "ls"],
    ["bash", "-x", "ls"],
    ["bash", "ls"],
    ["./bash", "-lc", "ls"],
    ["/tmp/bash", "-lc", "ls"],
    ["fish", "-c", "ls"],
    ["bash", "-lc", "rm -rf /"],
]


@pytest.mark.parametrize("argv", SAFE, ids=repr)
def test_known_safe(argv):
    assert is_known_safe_command(argv)


@pytest.mark.parametrize("argv", UNSAFE, ids=repr)
def test_not_known_safe(argv):
    assert not is_known_safe_command(argv)


@pytest.mark.parametrize(("script", "commands"), PARSED, ids=repr)
def test_parse_plain_script(script, commands):
    parsed = parse_plain_script(script)
    assert parsed is not None
    assert [c.argv for c in parsed] == commands


def test_parse_plain_script_marks_globs():
    assert parse_plain_script("ls *.py 'x*'") == [PlainCommand(("ls", "*.py", "x*"), True)]
    assert parse_plain_script("ls 'x*' \"[y]\" z\\?") == [
        PlainCommand(("ls", "x*", "[y]", "z?"), False)
    ]


# -- the decision table -----------------------------------------------------------------

SAFE_CMD = ["ls", "-la"]
UNSAFE_CMD = ["make", "install"]
APPROVED_CMD = ["npm", "install"]
APPROVED = {tuple(APPROVED_CMD)}

SANDBOXED = AutoApprove(run_sandboxed=True)
UNSANDBOXED = AutoApprove(run_sandboxed=False)
ASK = AskUser()


def escalation_rejected(policy):
    return Reject(
        f"approval policy is {policy}; reject command — you should not ask for "
        f"escalated permissions if the approval policy is {policy}"
    )


# (policy, command, escalated) -> decision, under a workspace-write sandbox
TABLE = {
    (UNTRUSTED, "safe", False): SANDBOXED,
    (UNTRUSTED, "unsafe", False): ASK,
    (UNTRUSTED, "approved", False): UNSANDBOXED,
    (UNTRUSTED, "safe", True): ASK,
    (UNTRUSTED, "unsafe", True): ASK,
    (UNTRUSTED, "approved", True): UNSANDBOXED,
    (ON_FAILURE, "safe", False): SANDBOXED,
    (ON_FAILURE, "unsafe", False): SANDBOXED,
    (ON_FAILURE, "approved", False): UNSANDBOXED,
    (ON_FAILURE, "safe", True): escalation_rejected("on-failure"),
    (ON_FAILURE, "unsafe", True): escalation_rejected("on-failure"),
    (ON_FAILURE, "approved", True): UNSANDBOXED,
    (ON_REQUEST, "safe", False): SANDBOXED,
    (ON_REQUEST, "unsafe", False): SANDBOXED,
    (ON_REQUEST, "approved", False): UNSANDBOXED,
    (ON_REQUEST, "safe", True): ASK,
    (ON_REQUEST, "unsafe", True): ASK,
    (ON_REQUEST, "approved", True): UNSANDBOXED,
    (NEVER, "safe", False): SANDBOXED,
    (NEVER, "unsafe", False): SANDBOXED,
    (NEVER, "approved", False): UNSANDBOXED,
    (NEVER, "safe", True): escalation_rejected("never"),
    (NEVER, "unsafe", True): escalation_rejected("never"),
    (NEVER, "approved", True): UNSANDBOXED,
}
COMMANDS = {"safe": SAFE_CMD, "unsafe": UNSAFE_CMD, "approved": APPROVED_CMD}


@pytest.mark.parametrize(("policy", "kind", "escalated"), list(TABLE), ids=str)
@pytest.mark.parametrize("sandbox", [READ_ONLY, WORKSPACE, WORKSPACE_NET], ids=["ro", "ws", "ws+net"])
def test_decision_table(policy, kind, escalated, sandbox):
    got = assess_command_safety(COMMANDS[kind], policy, sandbox, APPROVED, escalated)
    assert got == TABLE[policy, kind, escalated]


@pytest.mark.parametrize(("policy", "kind", "escalated"), list(TABLE), ids=str)
def test_decision_table_danger_full_access(policy, kind, escalated):
    got = assess_command_safety(COMMANDS[kind], policy, FULL, APPROVED, escalated)
    if policy is UNTRUSTED and kind == "unsafe":
        assert got == ASK  # the user still wants to approve untrusted commands
    else:
        assert got == UNSANDBOXED  # nothing to escalate from


NO_SANDBOX = {
    (UNTRUSTED, "safe"): UNSANDBOXED,
    (UNTRUSTED, "unsafe"): ASK,
    (ON_FAILURE, "safe"): UNSANDBOXED,
    (ON_FAILURE, "unsafe"): ASK,
    (ON_REQUEST, "safe"): UNSANDBOXED,
    (ON_REQUEST, "unsafe"): ASK,
    (NEVER, "safe"): UNSANDBOXED,
    (NEVER, "unsafe"): Reject("auto-rejected because command is not on trusted list"),
}


@pytest.mark.parametrize(("policy", "kind"), list(NO_SANDBOX), ids=str)
def test_decision_without_a_sandbox(policy, kind):
    got = assess_command_safety(COMMANDS[kind], policy, WORKSPACE, APPROVED, sandbox_available=False)
    assert got == NO_SANDBOX[policy, kind]
    approved = assess_command_safety(APPROVED_CMD, policy, WORKSPACE, APPROVED, sandbox_available=False)
    assert approved == UNSANDBOXED


def test_known_safe_shell_script_is_auto_approved_under_untrusted():
    got = assess_command_safety(bash("git status && git diff | head"), UNTRUSTED, WORKSPACE, set())
    assert got == SANDBOXED
    got = assess_command_safety(bash("git status && rm -rf ."), UNTRUSTED, WORKSPACE, set())
    assert got == ASK


def test_approval_is_for_the_exact_argv():
    approved = {("npm", "install")}
    assert assess_command_safety(["npm", "install"], UNTRUSTED, WORKSPACE, approved) == UNSANDBOXED
    assert assess_command_safety(["npm", "install", "x"], UNTRUSTED, WORKSPACE, approved) == ASK
    assert assess_command_safety(["npm"], UNTRUSTED, WORKSPACE, approved) == ASK


def test_policy_may_be_given_as_its_name():
    assert assess_command_safety(UNSAFE_CMD, "untrusted", WORKSPACE, set()) == ASK
    with pytest.raises(ValueError):
        assess_command_safety(UNSAFE_CMD, "sometimes", WORKSPACE, set())


# -- patches --------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "work"
    (root / "src").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".sluice").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    return str(root), str(outside)


@pytest.mark.parametrize("policy", [ON_FAILURE, ON_REQUEST, NEVER])
def test_patch_inside_the_roots_is_auto_approved(workspace, policy):
    root, _ = workspace
    paths = ["src/a.py", os.path.join(root, "b.txt"), "new/dir/c.py"]
    assert assess_patch_safety(paths, policy, [root], root) == SANDBOXED


def test_patch_under_untrusted_always_asks(workspace):
    root, outside = workspace
    assert assess_patch_safety(["src/a.py"], UNTRUSTED, [root], root) == ASK
    # Outside the roots it asks for the directory as well: the patch is written in the sandbox.
    folder = os.path.realpath(outside)
    assert assess_patch_safety([os.path.join(outside, "x")], UNTRUSTED, [root], root) == AskUser(
        reason=f"grant write access to {folder} for this session", grant_root=folder)


@pytest.mark.parametrize("policy", [ON_FAILURE, ON_REQUEST])
def test_patch_outside_the_roots_asks_with_grant_root(workspace, policy):
    root, outside = workspace
    target = os.path.join(outside, "deep", "x.py")
    got = assess_patch_safety(["src/a.py", target], policy, [root], root)
    folder = os.path.realpath(os.path.join(outside, "deep"))
    assert got == AskUser(reason=f"grant write access to {folder} for this session", grant_root=folder)


def test_patch_grant_root_covers_every_offending_path(workspace):
    root, outside = workspace
    paths = [os.path.join(outside, "a", "x"), os.path.join(outside, "b", "y")]
    got = assess_patch_safety(paths, ON_REQUEST, [root], root)
    assert isinstance(got, AskUser)
    assert got.grant_root == os.path.realpath(outside)
    # Once granted, the same patch goes through.
    assert assess_patch_safety(paths, ON_REQUEST, [root, got.grant_root], root) == SANDBOXED


@pytest.mark.parametrize("policy", [UNTRUSTED, ON_FAILURE, ON_REQUEST])
@pytest.mark.parametrize("target", [".git/config", ".sluice/x", "sub/../.git/hooks/post-commit"])
def test_patch_into_a_protected_dir_asks_for_itself_never_a_root(workspace, policy, target):
    # The protected directory would be the root to grant, and the sandbox refuses it as a
    # root: approved, this patch alone is written without the write restrictions.
    root, _ = workspace
    got = assess_patch_safety(["src/a.py", target], policy, [root], root)
    assert isinstance(got, AskUser) and got.grant_root is None and got.unrestricted, got
    name = os.path.normpath(target).split(os.sep)[0]
    assert f"a repository's protected {name} ({os.path.realpath(root)}/{name})" in got.reason


def test_patch_outside_the_roots_is_rejected_under_never(workspace):
    root, outside = workspace
    got = assess_patch_safety([os.path.join(outside, "x")], NEVER, [root], root)
    assert got == Reject("writing outside of the project; rejected by user approval settings")


def test_patch_relative_escape_is_outside(workspace):
    root, _ = workspace
    got = assess_patch_safety(["../outside/x"], ON_REQUEST, [root], root)
    assert isinstance(got, AskUser) and got.grant_root is not None


@pytest.mark.parametrize("path", [".git/config", ".git/hooks/pre-commit", ".sluice/x", ".git"])
def test_patch_into_protected_subdirs_asks(workspace, path):
    root, _ = workspace
    got = assess_patch_safety([path], ON_REQUEST, [root], root)
    assert isinstance(got, AskUser)
    assert assess_patch_safety([path], NEVER, [root], root) == Reject(
        "writing outside of the project; rejected by user approval settings"
    )


def test_patch_through_a_symlink_is_judged_by_its_target(workspace):
    root, outside = workspace
    os.symlink(outside, os.path.join(root, "link"))
    got = assess_patch_safety(["link/x.py"], ON_REQUEST, [root], root)
    assert got == AskUser(
        reason=f"grant write access to {os.path.realpath(outside)} for this session",
        grant_root=os.path.realpath(outside),
    )
    # A link pointing into the roots is fine.
    os.symlink(os.path.join(root, "src"), os.path.join(outside, "back"))
    assert assess_patch_safety([os.path.join(outside, "back", "y")], ON_REQUEST, [root], root) == SANDBOXED


def test_empty_patch_is_rejected(workspace):
    root, _ = workspace
    for policy in AskForApproval:
        assert assess_patch_safety([], policy, [root], root) == Reject("empty patch")


def test_patch_under_danger_full_access(workspace):
    root, outside = workspace
    paths = [os.path.join(outside, "x"), ".git/config"]
    for policy in (ON_FAILURE, ON_REQUEST, NEVER):
        got = assess_patch_safety(paths, policy, [root], root, sandbox_policy=FULL)
        assert got == UNSANDBOXED
    assert assess_patch_safety(paths, UNTRUSTED, [root], root, sandbox_policy=FULL) == ASK


def test_patch_without_a_sandbox_asks(workspace):
    root, _ = workspace
    assert assess_patch_safety(["src/a.py"], ON_REQUEST, [root], root, sandbox_available=False) == ASK


def test_writable_roots_for_policies(tmp_path):
    cwd = str(tmp_path)
    env = {"TMPDIR": "/var/tmp/me/"}
    assert writable_roots_for(READ_ONLY, cwd, env) == []
    assert writable_roots_for(WORKSPACE, cwd, env) == ["/var/tmp/me", "/tmp", cwd]
    assert writable_roots_for(WORKSPACE, cwd, {}) == ["/tmp", cwd]
    extra = SandboxPolicy.from_mode("workspace-write", writable_roots=["/srv/data"])
    assert writable_roots_for(extra, cwd, {}) == ["/tmp", cwd, "/srv/data"]
    assert writable_roots_for(FULL, cwd, env) == ["/"]


def test_is_path_writable(workspace):
    root, outside = workspace
    assert is_path_writable("src/x", [root], root)
    assert is_path_writable(root, [root], root)
    assert not is_path_writable(root + "-sibling/x", [root], root)
    assert not is_path_writable(".git/x", [root], root)
    assert not is_path_writable(os.path.join(outside, "x"), [root], root)
    assert is_path_writable(os.path.join(outside, "x"), ["/"], root)
    assert not is_path_writable("/.git/x", ["/"], root)


# -- sandbox denials ------------------------------------------------------------------

DENIED = [
    (1, "", "touch: cannot touch '/etc/x': Permission denied\n", WORKSPACE),
    (1, "", "mkdir: cannot create directory '/usr/x': Permission denied\n", WORKSPACE),
    (1, "", "bash: line 1: /opt/x: Permission denied\n", WORKSPACE),
    (1, "", "PermissionError: [Errno 13] Permission denied: '/etc/x'\n", WORKSPACE),
    (1, "", "PermissionError: [Errno 1] Operation not permitted\n", WORKSPACE),
    (128, "", "fatal: Unable to create '/w/.git/index.lock': Read-only file system\n", WORKSPACE),
    (1, "", "Error: EACCES: permission denied, open '/etc/x'\n", WORKSPACE),
    (1, "", "Error: EROFS, open '/w/.git/config'\n", WORKSPACE),
    (1, "", "strace: attach: ptrace(PTRACE_SEIZE, 1): Operation not permitted\n", WORKSPACE),
    (2, "", "make: *** [install] cp: /usr/local/bin/x: Permission denied\n", WORKSPACE),
    (1, b"", b"touch: cannot touch '/etc/x': Permission denied\n", WORKSPACE),
    # merged output (2>&1): stderr empty
    (1, "cp: cannot create regular file '/etc/x': Permission denied\n", "", WORKSPACE),
    # network off
    (6, "", "curl: (6) Could not resolve host: example.com\n", WORKSPACE),
    (128, "", "fatal: unable to access 'https://github.com/x/y/': Could not resolve host: github.com\n", WORKSPACE),
    (1, "", "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>\n", WORKSPACE),
    (1, "", "connect: Network is unreachable\n", READ_ONLY),
    (1, "", "npm ERR! request to https://registry.npmjs.org failed, reason: getaddrinfo EAI_AGAIN\n", WORKSPACE),
    (4, "", "wget: unable to resolve host address 'example.com'\n", WORKSPACE),
    # seccomp's SIGSYS as a shell reports it
    (128 + signal.SIGSYS, "", "", WORKSPACE),
]

NOT_DENIED = [
    (1, "", "", WORKSPACE),  # bash -c false
    (0, "", "Permission denied\n", WORKSPACE),  # success
    (1, "", "error: sandbox is not happy\n", WORKSPACE),
    (1, "running in sandbox mode\n", "", WORKSPACE),
    (1, "", "sandbox: failed\n", WORKSPACE),
    (1, "", "seccomp landlock sandbox\n", WORKSPACE),
    (1, "", "cat: /nonexistent: No such file or directory\n", WORKSPACE),
    (2, "", "grep: x: No such file or directory\n", WORKSPACE),
    (127, "", "bash: line 1: foo: command not found\n", WORKSPACE),
    (126, "", "bash: ./x: Permission denied\n", WORKSPACE),
    (126, "", "sandbox exec failed: Operation not permitted\n", WORKSPACE),
    (7, "", "curl: (7) Failed to connect to localhost port 8080: Connection refused\n", WORKSPACE),
    (1, "", "ConnectionRefusedError: [Errno 111] Connection refused\n", WORKSPACE),
    # network allowed: a failed lookup is the network's fault, not the sandbox's
    (6, "", "curl: (6) Could not resolve host: example.com\n", WORKSPACE_NET),
    # danger-full-access: no sandbox to blame
    (1, "", "touch: cannot touch '/etc/x': Permission denied\n", FULL),
    # permission text on stdout while stderr says something else
    (1, "test_perms: expected 'Permission denied'\n", "1 test failed\n", WORKSPACE),
    (None, "", "", WORKSPACE),
]


@pytest.mark.parametrize(("code", "stdout", "stderr", "policy"), DENIED, ids=repr)
def test_sandbox_denied(code, stdout, stderr, policy):
    assert is_likely_sandbox_denied(code, stdout, stderr, policy)


@pytest.mark.parametrize(("code", "stdout", "stderr", "policy"), NOT_DENIED, ids=repr)
def test_not_sandbox_denied(code, stdout, stderr, policy):
    assert not is_likely_sandbox_denied(code, stdout, stderr, policy)


def test_timeout_is_never_a_denial():
    stderr = "touch: cannot touch '/etc/x': Permission denied\n"
    assert not is_likely_sandbox_denied(124, "", stderr, WORKSPACE, timed_out=True)
    assert is_likely_sandbox_denied(124, "", stderr, WORKSPACE)


def test_signals():
    assert is_likely_sandbox_denied(None, "", "", WORKSPACE, signal=signal.SIGSYS)
    assert not is_likely_sandbox_denied(None, "", "Permission denied", WORKSPACE, signal=signal.SIGKILL)
    assert not is_likely_sandbox_denied(None, "", "", WORKSPACE, signal=signal.SIGSEGV)


def test_unknown_policy_means_network_off():
    assert is_likely_sandbox_denied(6, "", "curl: (6) Could not resolve host: x\n", None)


# -- retrying without the sandbox -------------------------------------------------------


@dataclass
class Result:
    exit_code: int | None = 1
    stdout: bytes = b""
    stderr: bytes = b"touch: cannot touch '/etc/x': Permission denied\n"
    timed_out: bool = False
    signal: int | None = None
    aborted: bool = False
    error: str | None = None


@pytest.mark.parametrize(
    ("policy", "retry"), [(UNTRUSTED, True), (ON_FAILURE, True), (ON_REQUEST, False), (NEVER, False)]
)
def test_retry_unsandboxed_or_report_the_denial_by_policy(policy, retry):
    # Where nobody is asked to retry, the model is told of the denial instead; never both.
    assert should_retry_unsandboxed(Result(), policy, WORKSPACE) is retry
    assert should_report_denial(Result(), policy, WORKSPACE) is not retry


@pytest.mark.parametrize("policy", [UNTRUSTED, ON_FAILURE, ON_REQUEST, NEVER])
@pytest.mark.parametrize(
    "result",
    [
        Result(exit_code=124, timed_out=True),
        Result(exit_code=None, signal=signal.SIGKILL, timed_out=True),
        Result(exit_code=None, signal=signal.SIGTERM, aborted=True),
        Result(exit_code=None, error="sandbox set-up failed: Landlock ABI too old"),
        Result(stderr=b""),  # bash -c false
        Result(stderr=b"sandbox\n"),
        Result(exit_code=0),
    ],
    ids=repr,
)
def test_no_retry_and_no_denial(policy, result):
    assert not should_retry_unsandboxed(result, policy, WORKSPACE)
    assert not should_report_denial(result, policy, WORKSPACE)


def test_no_retry_and_no_denial_for_an_unsandboxed_run():
    assert not should_retry_unsandboxed(Result(), ON_FAILURE, WORKSPACE, ran_sandboxed=False)
    assert not should_retry_unsandboxed(Result(), ON_FAILURE, FULL)
    assert not should_report_denial(Result(), NEVER, WORKSPACE, ran_sandboxed=False)
    assert not should_report_denial(Result(), NEVER, FULL)


def test_retry_reads_minimal_results():
    @dataclass
    class Minimal:
        exit_code: int
        stdout: str
        stderr: str

    assert should_retry_unsandboxed(Minimal(1, "", "Read-only file system"), ON_FAILURE)
    assert not should_retry_unsandboxed(Minimal(1, "", ""), ON_FAILURE)


def test_retry_reason_is_codex_text():
    assert RETRY_WITHOUT_SANDBOX_REASON == "command failed; retry without sandbox?"


@pytest.mark.parametrize("policy", [UNTRUSTED, ON_FAILURE, ON_REQUEST, NEVER])
@pytest.mark.parametrize("sandbox", [READ_ONLY, WORKSPACE, WORKSPACE_NET, FULL])
def test_input_to_a_session_is_asked_for_only_when_it_runs_unsandboxed_and_someone_can_be_asked(policy, sandbox):
    # A sandboxed session's input stays in its sandbox; under danger-full-access nothing
    # is sandboxed and nothing was approved to leave it; under never nobody is asked.
    assert not input_needs_approval(True, policy, sandbox)
    assert input_needs_approval(False, policy, sandbox) == (policy != NEVER and sandbox is not FULL)
