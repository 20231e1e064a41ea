"""What the model is told before the conversation: base instructions, the user's, the project's.

:func:`full_instructions` joins, in this order:

1. :data:`BASE_INSTRUCTIONS`, sluice's own description of the agent and its tools;
2. the user instructions: ``configure_session.instructions`` (from ``config.toml`` or
   flags) and the project docs, joined by Codex's separator
   ``"\\n\\n--- project-doc ---\\n\\n"``;
3. the environment: cwd, approval policy, sandbox.

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
from pathlib import Path

import structlog

from agent.safety import writable_roots_for
from agent.sandbox_files import NONE, FileAccessError, FileState, SandboxFiles
from broker.wire.protocol import AskForApproval, SandboxPolicy

log = structlog.get_logger("agent.instructions")

PROJECT_DOC_FILENAME = "AGENTS.md"
PROJECT_DOC_MAX_BYTES = 32 * 1024
PROJECT_DOC_SEPARATOR = "\n\n--- project-doc ---\n\n"

BASE_INSTRUCTIONS = """\
You are a coding agent running in sluice, on the user's computer. You and the user share \
the same workspace; work in it to complete the user's task, then reply with a short \
summary of what you did.

Tools:
- `shell` runs a command (an argv array; use ["bash", "-lc", "..."] for a shell script) \
and returns its output and exit code. Long output is cut to its head and tail. Commands \
run in a sandbox; what the sandbox allows is listed under Environment below.
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
(at most one in_progress). Use it for tasks of several steps.

Keep changes focused on the task. Do not undo changes you did not make. Prefer `rg` \
for searching. If a command is refused or fails in the sandbox, say so rather than \
working around it."""


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


def environment_context(cwd: str, approval_policy: AskForApproval, sandbox_policy: SandboxPolicy) -> str:
    if sandbox_policy.is_unrestricted():
        sandbox = "danger-full-access: no sandbox"
    elif sandbox_policy.has_full_disk_write_access():
        sandbox = "full disk write access"
    else:
        roots = writable_roots_for(sandbox_policy, cwd)
        sandbox = "writable roots: " + ", ".join(roots) if roots else "read-only"
    network = "enabled" if sandbox_policy.has_full_network_access() else "restricted"
    return (
        "Environment:\n"
        f"- working directory: {cwd}\n"
        f"- approval policy: {approval_policy}\n"
        f"- sandbox: {sandbox}\n"
        f"- network access: {network}"
    )


def full_instructions(
    user: str | None,
    cwd: str,
    approval_policy: AskForApproval,
    sandbox_policy: SandboxPolicy,
    base: str = BASE_INSTRUCTIONS,
) -> str:
    sections = [base]
    if user:
        sections.append(user)
    sections.append(environment_context(cwd, approval_policy, sandbox_policy))
    return "\n\n".join(sections)
