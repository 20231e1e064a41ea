"""Approval decisions: run a command or patch, ask the user first, or refuse it.

This is Codex's ``safety.rs`` and the sandbox-retry part of its ``codex.rs``, for
sluice's four approval policies. Every decision is a :data:`Safety`:

- :class:`AutoApprove` runs it without asking, in the sandbox or not (``run_sandboxed``);
- :class:`AskUser` sends an approval request; if the user approves, the command runs
  *unsandboxed* (as in Codex: people approve a command mostly because it needs what the
  sandbox forbids, e.g. network to install a dependency); a patch may carry a
  ``grant_root`` to add to the writable roots;
- :class:`Reject` returns ``reason`` to the model without running anything.

Commands (:func:`assess_command_safety`), first matching row wins; "sandboxed" means
the sandbox of the session's policy::

                              untrusted    on-failure   on-request   never
    approved before           run          run          run          run
    escalation requested      ask          reject       ask          reject
    known-safe                sandboxed    sandboxed    sandboxed    sandboxed
    anything else             ask          sandboxed    sandboxed    sandboxed

    with danger-full-access:  every "sandboxed" is "run", and an escalation request is
                              simply run (there is no sandbox to leave); untrusted still
                              asks about anything else
    with no sandbox at hand:  known-safe runs unsandboxed; anything else asks, except
                              under never, which rejects it

("run" = unsandboxed.) "Approved before": the user answered "always" (approved for the
session) when it was asked, or approved running it again without the sandbox after a
denial (below). Escalation is the model's ``with_escalated_permissions: true`` (the
seed's spelling) or ``sandbox_permissions: "require_escalated"`` (Codex's);
only ``on-request`` offers it to the model, and ``untrusted`` asks about everything else
anyway. Under ``never`` and ``on-failure`` the model is told not to ask for it.

Patches (:func:`assess_patch_safety`): an empty patch is rejected; ``untrusted`` asks;
otherwise a patch whose every path is writable (inside a writable root, not in a root's
``.git`` or ``.sluice``, symlinks resolved) is auto-approved, and one that writes
elsewhere asks with ``grant_root`` set to the folder to open up, or under ``never`` is
rejected. A ``.git``/``.sluice`` directory (or anything beneath one) is never proposed
as a root (the sandbox refuses one): a patch writing there asks ``unrestricted``, for
that patch alone. Under danger-full-access every path is writable.

After a sandboxed command fails in a way that looks like the sandbox's doing
(:func:`is_likely_sandbox_denied`): ``untrusted`` and ``on-failure`` ask
:data:`RETRY_WITHOUT_SANDBOX_REASON` (:func:`should_retry_unsandboxed`) and, approved
(once or for the session), rerun it unsandboxed and add it to the approved set, as the
seed does; ``on-request`` and ``never`` tell the model, in the seed's words
(:func:`should_report_denial`: ``failed in sandbox LinuxSeccomp with execution error:
sandbox denied exec error, exit code: N, stdout: ..., stderr: ...``), on which under
``on-request`` it may ask for escalation itself. A timeout is never escalated.

Where this departs from Codex:

- Known-safe commands run *in* the sandbox (Codex runs them unsandboxed). The sandbox
  costs little here, hides the daemon's runtime dir and keeps hooks named by a
  repository's config (``core.fsmonitor`` under ``git status``) inside it.
- An escalation request outranks the known-safe list: ``cat`` with escalation asks,
  because running it sandboxed would ignore the request and running it unsandboxed
  silently would skip the user.
- Under ``on-failure`` a patch outside the writable roots asks first (Codex applies it
  in the sandbox and asks after the failure); sluice applies patches itself.
- Sandbox denials are judged by exit code *and* output (see
  :func:`is_likely_sandbox_denied`) instead of by exit code alone.
"""

from __future__ import annotations

import os
import re
import signal as _signal
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.safe_commands import is_known_safe_command
from broker.wire.frames import ExitStatus
from broker.wire.protocol import RETRY_WITHOUT_SANDBOX_REASON, AskForApproval, SandboxPolicy
from landlock_helper.policy import PROTECTED_SUBDIRS, write_allowed

__all__ = [
    "RETRY_WITHOUT_SANDBOX_REASON",
    "AskUser",
    "AutoApprove",
    "Reject",
    "Safety",
    "assess_command_safety",
    "assess_patch_safety",
    "assess_safety_for_untrusted_command",
    "input_needs_approval",
    "is_known_safe_command",
    "is_likely_sandbox_denied",
    "is_path_writable",
    "should_report_denial",
    "should_retry_unsandboxed",
    "writable_roots_for",
]

# Inside each writable root these stay read-only (the sandbox binds them read-only).


@dataclass(frozen=True, slots=True)
class AutoApprove:
    """Run without asking."""

    run_sandboxed: bool


@dataclass(frozen=True, slots=True)
class AskUser:
    """Ask first; if approved, run unsandboxed (commands) or add ``grant_root`` (patches).
    ``unrestricted`` (patches): approved, this one patch is written without the
    sandbox's write restrictions (it writes into a protected ``.git``/``.sluice``, which
    no root granted for the session may open)."""

    reason: str | None = None
    grant_root: str | None = None
    unrestricted: bool = False


@dataclass(frozen=True, slots=True)
class Reject:
    """Do not run; tell the model ``reason``."""

    reason: str


Safety = AutoApprove | AskUser | Reject

_UNTRUSTED, _ON_FAILURE, _ON_REQUEST, _NEVER = (
    AskForApproval.UNTRUSTED,
    AskForApproval.ON_FAILURE,
    AskForApproval.ON_REQUEST,
    AskForApproval.NEVER,
)


# -- commands -------------------------------------------------------------------------


def assess_command_safety(
    argv: Sequence[str],
    approval_policy: AskForApproval,
    sandbox_policy: SandboxPolicy,
    approved: Collection[tuple[str, ...]],
    with_escalated_permissions: bool = False,
    *,
    sandbox_available: bool = True,
) -> Safety:
    """What to do with a command the model asked to run (the table in the module doc).

    ``approved`` holds the argvs the user approved for the session (as tuples).
    ``with_escalated_permissions``: the model asked to run it outside the sandbox, in
    either spelling (:func:`agent.tools.escalation_requested`).
    ``sandbox_available`` is False where no sandbox can be applied (always True on Linux
    with a new enough kernel; the executor refuses to run sandboxed commands otherwise).
    """
    policy = AskForApproval(approval_policy)
    if tuple(argv) in approved:
        # The user may have approved it precisely because it needs to leave the sandbox.
        return AutoApprove(run_sandboxed=False)
    unrestricted = sandbox_policy.is_unrestricted()
    if with_escalated_permissions and not unrestricted:
        if policy in (_UNTRUSTED, _ON_REQUEST):
            return AskUser()
        return Reject(
            f"approval policy is {policy}; reject command — you should not ask for "
            f"escalated permissions if the approval policy is {policy}"
        )
    if is_known_safe_command(argv):
        return AutoApprove(run_sandboxed=sandbox_available and not unrestricted)
    return assess_safety_for_untrusted_command(
        policy, sandbox_policy, sandbox_available=sandbox_available
    )


def assess_safety_for_untrusted_command(
    approval_policy: AskForApproval,
    sandbox_policy: SandboxPolicy,
    *,
    sandbox_available: bool = True,
) -> Safety:
    """The "anything else" row: a command neither known-safe nor approved."""
    policy = AskForApproval(approval_policy)
    if policy == _UNTRUSTED:
        # Even with danger-full-access: the user asked to approve untrusted commands.
        return AskUser()
    if sandbox_policy.is_unrestricted():
        return AutoApprove(run_sandboxed=False)
    if sandbox_available:
        return AutoApprove(run_sandboxed=True)
    if policy == _NEVER:
        # Nobody to ask and nothing to contain it.
        return Reject("auto-rejected because command is not on trusted list")
    return AskUser()


def input_needs_approval(sandboxed: bool, approval_policy: AskForApproval, sandbox_policy: SandboxPolicy) -> bool:
    """Whether input the model types into a running session must be approved first.

    A session that runs without the sandbox (started so after an escalation or a retry
    someone approved) runs whatever it is typed with the user's full rights, and an
    approval covered the command, not what the model types into it later: ``sh -i``
    behind a script that failed "Permission denied" in the sandbox would otherwise be an
    unsandboxed shell for the rest of the session. So each write to one is asked for,
    under every policy but ``never`` (nobody to ask: the user chose not to be), and not
    when the session's policy is danger-full-access (then nothing is sandboxed, and no
    approval was needed to leave a sandbox). A sandboxed session's input stays in its
    sandbox and is never asked for.
    """
    if sandboxed or sandbox_policy.is_unrestricted():
        return False
    return AskForApproval(approval_policy) != _NEVER


# -- patches --------------------------------------------------------------------------


def writable_roots_for(
    sandbox_policy: SandboxPolicy, cwd: str, env: Mapping[str, str] | None = None
) -> list[str]:
    """The writable roots a sandbox of ``sandbox_policy`` in ``cwd`` gives, normalised,
    in the order the sandbox builds them (``/`` alone for full write access).

    ``cwd`` is the session's (what the sandbox's ``disk-write-cwd`` means), never the
    workdir a command runs in.

    ``env`` supplies $TMPDIR (the commands' environment; ours if None).
    """
    if sandbox_policy.has_full_disk_write_access():
        return ["/"]
    # The sandbox computes them (landlock_helper.policy), so the two never disagree.
    return sandbox_policy.writable_roots(cwd, dict(os.environ if env is None else env))


def _resolve(path: str | os.PathLike[str], cwd: str) -> str:
    """Absolute and with symlinks resolved: where a write would land now. (Only a
    guess, since a path can change under us: patches are written in the sandbox, which
    decides at the moment of the write.)"""
    path = os.path.join(cwd, os.fspath(path))
    try:
        return os.path.realpath(path)
    except OSError:  # a link being swapped as we look (EINVAL from readlink)
        return os.path.normpath(path)


def is_path_writable(
    path: str | os.PathLike[str], writable_roots: Iterable[str], cwd: str
) -> bool:
    """Whether writing ``path`` (relative to ``cwd``) stays inside a writable root and
    out of every root's ``.git`` and ``.sluice``. Symlinks are followed, so a link in
    the workspace that points elsewhere is judged by where it points."""
    return write_allowed(_resolve(path, cwd), [_resolve(root, cwd) for root in writable_roots])


def _protected_part(path: str) -> str | None:
    """The protected directory (``.git``/``.sluice``) ``path`` is or lies beneath, if any."""
    parts = path.split(os.sep)
    for i, name in enumerate(parts):
        if name in PROTECTED_SUBDIRS:
            return os.sep.join(parts[:i + 1])
    return None


def _ask_for(offending: Sequence[str]) -> AskUser:
    """The question for a patch that writes ``offending`` paths outside the writable
    roots: a root to grant for the session, or, where a path lies in a protected
    ``.git``/``.sluice`` (never a root: the sandbox refuses one), this patch alone."""
    protected = next((part for p in offending if (part := _protected_part(p)) is not None), None)
    if protected is not None:
        name = os.path.basename(protected)
        return AskUser(reason=f"the patch writes into a repository's protected {name} ({protected}); "
                              f"approved, this patch alone is written without the sandbox's write restrictions",
                       unrestricted=True)
    root = _grant_root(offending)
    return AskUser(reason=f"grant write access to {root} for this session", grant_root=root)


def _grant_root(offending: Sequence[str]) -> str:
    """The folder whose write access would let every offending path through."""
    parents = [os.path.dirname(p) or p for p in offending]
    return os.path.commonpath(parents)


def assess_patch_safety(
    action_paths: Iterable[str | os.PathLike[str]],
    approval_policy: AskForApproval,
    writable_roots: Iterable[str],
    cwd: str,
    *,
    sandbox_policy: SandboxPolicy | None = None,
    sandbox_available: bool = True,
) -> Safety:
    """What to do with a patch that writes ``action_paths`` (every added, deleted,
    updated path and every move destination), relative to ``cwd``.

    AutoApprove.run_sandboxed says whether a sandbox is there to contain the write
    should a path still escape (Codex applies patches inside the sandbox for that
    reason: a hard link in a writable root can point outside it).
    """
    policy = AskForApproval(approval_policy)
    paths = list(action_paths)
    if not paths:
        return Reject("empty patch")
    full_write = sandbox_policy is not None and sandbox_policy.has_full_disk_write_access()
    roots = list(writable_roots)
    offending = [] if full_write else [_resolve(p, cwd) for p in paths if not is_path_writable(p, roots, cwd)]
    if policy == _UNTRUSTED:
        # Asked either way; a patch that leaves the roots asks for the directory too,
        # since it is written in the session's sandbox.
        if not offending:
            return AskUser()
        return _ask_for(offending)
    if full_write:
        return AutoApprove(run_sandboxed=False)
    if not offending:
        if sandbox_available:
            return AutoApprove(run_sandboxed=True)
        # Without a sandbox nothing backs the path check up (hard links); ask.
        return AskUser()
    if policy == _NEVER:
        return Reject("writing outside of the project; rejected by user approval settings")
    return _ask_for(offending)


# -- sandbox denials ------------------------------------------------------------------

# What EACCES, EPERM and EROFS look like in C tools, Python, Go, Rust, Node and Java.
_FS_DENIAL = re.compile(
    r"permission denied|operation not permitted|read-only file system", re.IGNORECASE
)
_FS_DENIAL_CODES = re.compile(r"\bE(?:ACCES|PERM|ROFS)\b|AccessDeniedException")
# What a blocked socket looks like. Without network permission the sandbox refuses to
# create internet sockets (EPERM, matched above), which resolvers report as a failed
# lookup. "Connection refused" is left out: nothing in the sandbox produces it, while
# a server that is simply not running does.
_NET_DENIAL = re.compile(
    r"network is unreachable|temporary failure in name resolution"
    r"|could not resolve host|couldn't resolve host|unable to resolve host"
    r"|\bEAI_AGAIN\b|\bENETUNREACH\b",
    re.IGNORECASE,
)
# 126: found but not executable; 127: not found. Also what the sandbox helper reports
# when the command could not start. Running unsandboxed would not change either.
_NOT_DENIAL_EXIT_CODES = frozenset({126, 127})
_SIGSYS = int(_signal.SIGSYS)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data).decode("utf-8", errors="replace")
    return data


def is_likely_sandbox_denied(
    exit_code: int | None,
    stdout: bytes | str | None,
    stderr: bytes | str | None,
    sandbox_policy: SandboxPolicy | None,
    *,
    timed_out: bool = False,
    signal: int | None = None,
) -> bool:
    """Whether a command that failed in the sandbox looks like the sandbox stopped it.

    Yes when it was killed by SIGSYS (seccomp), or exited non-zero (not 126/127) with a
    permission error on stderr (on stdout when stderr is empty, for ``2>&1`` scripts),
    or, when the policy has no network, a failed name lookup or unreachable network.
    Never for a timeout, a success, a command run unrestricted, or a plain failure with
    no such message: ``false`` is not a denial, nor is output that mentions "sandbox".

    ``sandbox_policy`` None means the policy is unknown: network is taken to be off.
    """
    if timed_out:
        return False
    if sandbox_policy is not None and sandbox_policy.is_unrestricted():
        return False
    if signal is not None:
        return signal == _SIGSYS
    if exit_code is None or exit_code == 0 or exit_code in _NOT_DENIAL_EXIT_CODES:
        return False
    if exit_code in (128 + _SIGSYS, -_SIGSYS):  # a shell's or Python's report of SIGSYS
        return True
    text = _text(stderr)
    if not text.strip():
        text = _text(stdout)
    if _FS_DENIAL.search(text) or _FS_DENIAL_CODES.search(text):
        return True
    network = sandbox_policy is not None and sandbox_policy.has_full_network_access()
    return not network and _NET_DENIAL.search(text) is not None


def _denied_by_sandbox(result: ExitStatus, sandbox_policy: SandboxPolicy | None) -> bool:
    """Whether a sandboxed run's ``result`` is a sandbox denial: never a timeout, an
    interrupt or a command that never started (``result.error``), else as
    :func:`is_likely_sandbox_denied` judges it."""
    if getattr(result, "timed_out", False) or getattr(result, "aborted", False):
        return False
    if getattr(result, "error", None):
        return False
    return is_likely_sandbox_denied(
        result.exit_code,
        result.stdout,
        result.stderr,
        sandbox_policy,
        signal=getattr(result, "signal", None),
    )


def should_retry_unsandboxed(
    result: ExitStatus,
    approval_policy: AskForApproval,
    sandbox_policy: SandboxPolicy | None = None,
    *,
    ran_sandboxed: bool = True,
) -> bool:
    """Whether to ask the user :data:`RETRY_WITHOUT_SANDBOX_REASON` after ``result``.

    Only under ``untrusted`` and ``on-failure``, only for a sandboxed run the sandbox
    denied (:func:`_denied_by_sandbox`). If the user approves (once or for the session),
    the command joins the session's approved set, as in Codex, so it skips the sandbox
    from then on.
    """
    if not ran_sandboxed or AskForApproval(approval_policy) not in (_UNTRUSTED, _ON_FAILURE):
        return False
    return _denied_by_sandbox(result, sandbox_policy)


def should_report_denial(
    result: ExitStatus,
    approval_policy: AskForApproval,
    sandbox_policy: SandboxPolicy | None = None,
    *,
    ran_sandboxed: bool = True,
) -> bool:
    """Whether the model is told that the sandbox denied the command (the seed's
    ``failed in sandbox ...``) instead of getting its output as usual: under
    ``on-request`` and ``never``, where nobody is asked to retry it, for a sandboxed run
    the sandbox denied. Under ``on-request`` that is the model's cue to ask for
    escalation."""
    if not ran_sandboxed or AskForApproval(approval_policy) not in (_ON_REQUEST, _NEVER):
        return False
    return _denied_by_sandbox(result, sandbox_policy)
