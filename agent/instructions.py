"""What the model is told before the conversation: base instructions, the user's, the project's,
and the environment.

:func:`full_instructions` (the request's ``instructions``) joins, in this order:

1. :func:`base_instructions`, sluice's own description of the agent and of the tools the
   session offers (its ``unified_exec`` setting: ``shell``; ``shell`` and
   ``unified_exec``; or ``exec_command`` and ``write_stdin``), or the frontend's
   ``base_instructions`` in their place;
2. the user instructions: ``configure_session.instructions`` (from ``config.toml`` or
   flags) and the project docs, joined by Codex's separator
   ``"\\n\\n--- project-doc ---\\n\\n"``.

The environment is not in the instructions but, as in Codex, a user message in the
conversation (:class:`EnvironmentContext`): cwd, approval policy, sandbox mode, network
access, the roots the policy adds, and the user's shell, in Codex's
``<environment_context>`` XML; sent at the start of the conversation, and again (only
what changed) when a later ``configure_session`` changes it.

Project docs (:func:`project_doc`) are the ``AGENTS.md`` files of the git repository
root and of the cwd (the root's first; one file when they are the same directory), the
git root being the nearest directory at or above the cwd holding a ``.git`` file or
directory. Empty files are skipped; together they are cut to
:data:`PROJECT_DOC_MAX_BYTES`, as Codex's ``project_doc_max_bytes``. They are read as a
command of the session would read them: in its sandbox (:mod:`agent.sandbox_files`),
regular files only, within :data:`PROJECT_DOC_TIMEOUT_MS`; what the sandbox cannot see
is not there, and a doc that cannot be read in time is skipped with a log line.
"""

from __future__ import annotations

import asyncio
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent.sandbox_files import NONE, FileAccessError, FileState, SandboxFiles
from broker.wire.protocol import AskForApproval, SandboxPolicy

log = structlog.get_logger("agent.instructions")

PROJECT_DOC_FILENAME = "AGENTS.md"
PROJECT_DOC_MAX_BYTES = 32 * 1024
PROJECT_DOC_SEPARATOR = "\n\n--- project-doc ---\n\n"
ENVIRONMENT_CONTEXT_OPEN = "<environment_context>"
ENVIRONMENT_CONTEXT_CLOSE = "</environment_context>"

# The base instructions, one part per tool; :func:`base_instructions` puts together the
# parts for the tools a session offers (agent.tools.tools_for), so the model is told of
# exactly those.
_INTRO = """\
You are a coding agent running in sluice, on the user's computer. You and the user share \
the same workspace; work in it to complete the user's task, then reply with a short \
summary of what you did.

Commands run in a sandbox; the <environment_context> message says where (cwd), under \
which sandbox mode and approval policy, with which network access and shell.

Tools:"""

_SHELL = """\
- `shell` runs a command (an argv array; use ["bash", "-lc", "..."] for a shell script) \
and returns its output and exit code. Long output is cut to its head and tail."""

_UNIFIED_EXEC = """\
- `unified_exec` runs a command in a terminal that stays open across calls, for \
interactive programs (shells, REPLs, debuggers, servers). Without `session_id`, `input` \
is the argv to start; with the `session_id` it returned, `input` is text to type into \
that terminal (end a line with \\n). It returns what was printed within `timeout_ms`, \
and the `session_id` while the program still runs."""

_EXEC_COMMAND = """\
- `exec_command` runs `cmd`, a command line, in a shell (bash by default) and returns \
what it printed within `yield_time_ms`: with its exit code if it has ended, else with a \
session ID. Give `tty: true` for a program you will type into.
- `write_stdin` types `chars` into a session exec_command left running (empty `chars`: \
just wait for more output) and returns what it printed since. Long output is cut in the \
middle to `max_output_tokens`."""

_APPLY_PATCH_AND_PLAN = """\
- `apply_patch` edits files. Its `input` is a patch:
  *** Begin Patch
  *** Add File: path/new.txt
  +line
  *** Update File: path/old.py
  *** Move to: path/renamed.py   (optional)
  @@ def context_line():
  -old line
  +new line
  *** Delete File: path/gone.txt
  *** End Patch
  Paths are relative to the working directory. Give three lines of context around \
each change, and an `@@` line naming the class or function when that is not unique.
- `update_plan` keeps a short plan of steps, each pending, in_progress or completed \
(at most one in_progress). Use it for tasks of several steps."""

_CLOSING = """\
Keep changes focused on the task. Do not undo changes you did not make. Prefer `rg` \
for searching. If a command is refused or fails in the sandbox, say so rather than \
working around it."""

_COMMAND_TOOLS = {"off": (_SHELL,), "seed": (_SHELL, _UNIFIED_EXEC), "codex": (_EXEC_COMMAND,)}


def base_instructions(tools: str = "seed") -> str:
    """sluice's description of the agent and of the tools of a session whose
    ``unified_exec`` setting is ``tools`` (``off``, ``seed`` or ``codex``)."""
    return "\n".join([_INTRO, *_COMMAND_TOOLS[tools], _APPLY_PATCH_AND_PLAN]) + "\n\n" + _CLOSING


BASE_INSTRUCTIONS = base_instructions()


# Reading the project docs may take this long (in the sandbox, from its start) and this
# long in all (waiting for an executor included); past either, the session starts without them.
PROJECT_DOC_TIMEOUT_MS = 2000
PROJECT_DOC_WAIT_S = 10.0


def _doc(path: str, state: FileState | None, budget: int) -> str | None:
    if state is None or (state.kind == NONE and state.error == "No such file or directory"):
        return None
    reason = state.not_a_file_reason() if not state.truncated else None
    if reason is not None or state.data is None:
        log.warning("project doc unreadable", path=path, error=reason)
        return None
    data = state.data
    if state.truncated or len(data) > budget:
        log.warning("project doc truncated", path=path, max_bytes=PROJECT_DOC_MAX_BYTES)
        data = data[:budget]
    text = data.decode("utf-8", errors="ignore")
    return text if text.strip() else None


async def project_doc(files: SandboxFiles, cwd: str | os.PathLike[str],
                      max_bytes: int = PROJECT_DOC_MAX_BYTES) -> str | None:
    """The ``AGENTS.md`` of the git root and of ``cwd``, joined; None if neither has one
    (or they could not be read in time). Read in the session's sandbox: what it hides
    (the daemon's runtime dir, ``$SLUICE_HOME``, the host's /tmp) is not there to read,
    only regular files are read, and a FIFO never blocks."""
    try:
        here = Path(cwd).resolve()
    except OSError:
        here = Path(cwd)
    ancestors = [here, *here.parents]
    # One batch: every candidate AGENTS.md and .git up to /, since the root is not known yet.
    docs_at = [str(d / PROJECT_DOC_FILENAME) for d in ancestors]
    try:
        states = await asyncio.wait_for(
            files.read(docs_at, [str(d / ".git") for d in ancestors], max_bytes=max_bytes), PROJECT_DOC_WAIT_S)
    except (FileAccessError, asyncio.TimeoutError) as err:
        log.warning("project docs skipped", cwd=str(here), error=str(err) or "timed out")
        return None
    root = next((d for d in ancestors if states[str(d / ".git")].kind != NONE), None)
    directories = [root] if root is not None and root != here else []
    directories.append(here)
    docs: list[str] = []
    budget = max_bytes
    for directory in directories:
        if budget <= 0:
            break
        path = str(directory / PROJECT_DOC_FILENAME)
        doc = _doc(path, states.get(path), budget)
        if doc is not None:
            docs.append(doc)
            budget -= len(doc.encode("utf-8"))
    return "\n\n".join(docs) if docs else None


async def user_instructions(configured: str | None, cwd: str | os.PathLike[str], files: SandboxFiles) -> str | None:
    """Codex's ``get_user_instructions``: configured ones, then the project doc."""
    doc = await project_doc(files, cwd)
    if doc is None:
        return configured
    if configured:
        return f"{configured}{PROJECT_DOC_SEPARATOR}{doc}"
    return doc


@dataclass(frozen=True)
class EnvironmentContext:
    """What Codex tells the model of where it works, as its ``<environment_context>``
    user message. A field that is None is left out (a diff names only what changed)."""

    cwd: str | None
    approval_policy: str | None
    sandbox_mode: str | None
    network_access: str | None
    writable_roots: tuple[str, ...] | None
    shell: str

    @classmethod
    def of(cls, cwd: str, approval_policy: AskForApproval, sandbox_policy: SandboxPolicy,
           shell: str) -> EnvironmentContext:
        """Codex's mapping: the mode the policy is closest to, network ``enabled`` or
        ``restricted``, and the roots the policy names beyond the workspace's own (none
        listed when it names none)."""
        return cls(cwd=cwd, approval_policy=str(approval_policy), sandbox_mode=sandbox_policy.mode,
                   network_access="enabled" if sandbox_policy.has_full_network_access() else "restricted",
                   writable_roots=tuple(sandbox_policy.writable_folders) or None, shell=shell)

    def diff(self, before: EnvironmentContext) -> EnvironmentContext | None:
        """The context to send when it was ``before``: the fields that changed (the sandbox
        mode, network and roots together, as Codex does when the policy changed) and the
        shell; None when nothing did."""
        policy = (self.sandbox_mode, self.network_access, self.writable_roots)
        policy_changed = policy != (before.sandbox_mode, before.network_access, before.writable_roots)
        changed = EnvironmentContext(
            cwd=self.cwd if self.cwd != before.cwd else None,
            approval_policy=self.approval_policy if self.approval_policy != before.approval_policy else None,
            sandbox_mode=self.sandbox_mode if policy_changed else None,
            network_access=self.network_access if policy_changed else None,
            writable_roots=self.writable_roots if policy_changed else None,
            shell=self.shell,
        )
        return None if changed == EnvironmentContext(None, None, None, None, None, self.shell) else changed

    def serialize(self) -> str:
        """Codex's XML, line for line (two spaces of indent, no escaping, as Codex)."""
        lines = [ENVIRONMENT_CONTEXT_OPEN]
        for tag in ("cwd", "approval_policy", "sandbox_mode", "network_access"):
            value = getattr(self, tag)
            if value is not None:
                lines.append(f"  <{tag}>{value}</{tag}>")
        if self.writable_roots is not None:
            lines.append("  <writable_roots>")
            lines += [f"    <root>{root}</root>" for root in self.writable_roots]
            lines.append("  </writable_roots>")
        lines.append(f"  <shell>{self.shell}</shell>")
        lines.append(ENVIRONMENT_CONTEXT_CLOSE)
        return "\n".join(lines)

    def item(self) -> dict:
        """The user message that carries it in the conversation."""
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": self.serialize()}]}


def is_environment_context(item: dict) -> bool:
    """Whether ``item`` is an environment context message (ours, or a rollout's)."""
    content = item.get("content") if item.get("type") == "message" and item.get("role") == "user" else None
    return isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict) \
        and str(content[0].get("text", "")).startswith(ENVIRONMENT_CONTEXT_OPEN)


# The shells Codex names; any other login shell is reported as bash, what sluice's own
# command tools run (exec_command's default shell, the shell tool's usual ["bash", "-lc"]).
_SHELL_NAMES = ("bash", "zsh", "sh")


def user_shell() -> str:
    """The name of the user's login shell, as Codex finds it (the password database)."""
    try:
        name = os.path.basename(pwd.getpwuid(os.getuid()).pw_shell)
    except (KeyError, OSError):
        return "bash"
    return name if name in _SHELL_NAMES else "bash"


def full_instructions(user: str | None, base: str = BASE_INSTRUCTIONS) -> str:
    """The base instructions, then the user's (the environment goes in its own message)."""
    return f"{base}\n\n{user}" if user else base
