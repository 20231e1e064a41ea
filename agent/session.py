"""A Codex session as a library: Submissions in, Events out.

::

    session = Session(emit=events.append, runner=runner)
    await session.submit(Submission("0", ConfigureSession(...)))   # -> session_configured
    await session.submit(Submission("1", UserInput([TextInput("list the files")])))
    # -> task_started, agent_message_delta..., exec_command_begin, ..., task_complete

``emit(event)`` is called synchronously, in order, from the event loop; it must not block
(put the event on a queue or a socket). ``runner`` is the :class:`~agent.exec_runner.CommandRunner`
every command goes through; ``session_id`` is the id the daemon gave the session (a
fresh uuid4 when not given). :meth:`Session.submit` handles one submission and returns
once it is taken in: a task (a user turn, a compaction) runs in the background and its
events follow; approvals, interrupts and further input can be submitted meanwhile.

What each op does is Codex's ``submission_loop``:

- ``configure_session`` -> ``session_configured{session_id, model, history_log_id,
  history_entry_count}``. A relative (or missing) cwd is an ``error`` and changes
  nothing. Configuring again aborts the running task and keeps the history, the commands
  approved for the session and the roots granted to patches. ``resume_path`` restores the
  history from a rollout file and goes on recording in it; the session id becomes the
  rollout's, as in Codex (the daemon learns it from ``session_configured``). A rollout
  that cannot be resumed (unreadable, not a rollout, held by another session) is an
  ``error`` instead of ``session_configured`` and changes nothing: a resume never starts
  a fresh conversation in place of the one asked for. Lines of it that are corrupt are
  skipped and said in one ``background_event`` after ``session_configured``
  (:func:`agent.rollout.read_rollout`).
- The model's instructions: ``base_instructions`` if given, else the built-in ones for
  the session's tools; then ``user_instructions`` as given (later Codex's frontends put
  ``AGENTS.md`` in them), else ``instructions`` with the project docs found from the cwd.
  The environment (cwd, policies, shell) goes into the conversation as Codex's
  ``<environment_context>`` user message: whole when the conversation starts, starts over
  after a compaction, or is resumed from a rollout whose last context was another; only
  what changed when a later ``configure_session`` changes it
  (:class:`agent.instructions.EnvironmentContext`).
  ``model_reasoning_effort`` / ``model_reasoning_summary`` become the Responses API's
  ``reasoning`` (for models that reason).
- Before the first ``configure_session``, ``user_input``, ``interrupt``, approvals and
  ``compact`` get the ``error`` "No session initialized, expected 'ConfigureSession' as
  first Op". ``add_to_history``, ``get_history_entry_request`` and ``shutdown`` work
  without one, as in Codex.
- ``user_input`` starts a task, or, while one runs, joins its next model request; as it
  joins the conversation it is announced as ``user_message{message, images?}`` (what was
  asked, for every frontend; after ``task_started``, as in Codex).
- ``interrupt`` (and an ``abort`` answer to an approval) cancels the running task at once:
  its running command is cancelled through the runner (``exec_command_end`` follows),
  pending approvals and queued input are dropped, then ``error`` "Turn interrupted" and
  ``turn_aborted{reason: interrupted}``.
- ``exec_approval`` / ``patch_approval`` answer the request of the task with that
  submission ``id`` (the request's ``call_id`` is accepted too).
- ``compact`` runs a compaction task (after the running task, if there is one).
- ``shutdown`` aborts any task, kills the session's long-lived commands (unified exec,
  :mod:`agent.unified_exec`; an interrupt leaves them running), syncs and closes the
  rollout, then ``shutdown_complete``; later submissions get an ``error``.
- ``exec_command_stdin`` (sluice's own) types into one of the session's running
  interactive commands, by the call id its events carry: ``exec_command_stdin_typed``
  (who typed what) to every frontend, then the text goes to the command's stdin as the
  model's ``write_stdin`` would send it, without an approval (a person's act) and without
  holding up later submissions; an unknown or ended command (or one without a terminal)
  is an ``error`` and nothing is written.
- ``add_to_history`` appends to ``history.jsonl``; ``get_history_entry_request`` answers
  ``get_history_entry_response``.

Files live under ``home`` (default ``$SLUICE_HOME``, else ``~/.sluice``): the rollout in
``sessions/``, the message history in ``history.jsonl``. Each item goes into the rollout as
it is recorded (:mod:`agent.rollout`), synced at every turn's end, so a killed agent's
session resumes from it. A rollout that cannot be made or written (a full disk) is one
``error`` event, ``rollout: no space left on device: PATH``, to the task running then (or,
at configure, after ``session_configured``); the session goes on unrecorded.

The API key comes with ``configure_session`` (``api_key``, resolved by the frontend
from its own environment); without it, the agent's own environment is tried. It is
only ever in the model client's ``Authorization`` header: never logged, never in events,
and scrubbed from the rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import structlog

from agent import history as message_history
from agent.apply_patch import TurnDiffTracker
from agent.provider import OPENAI_DEFAULT_BASE_URL, ResolvedProvider
from agent.exec_runner import CommandRunner
from agent.instructions import (
    PROJECT_DOC_TIMEOUT_MS,
    EnvironmentContext,
    base_instructions,
    full_instructions,
    is_environment_context,
    user_instructions,
    user_shell,
)
from agent.sandbox_files import SandboxFiles
from agent.items import Item, input_texts
from agent.mcp.config import grants
from agent.mcp.launcher import sandboxed_launcher
from agent.mcp.manager import McpManager
from agent.model_client import DEFAULT_BACKOFF_BASE, ModelClient, reasoning_param
from agent.rollout import RolloutError, RolloutRecorder, SavedSession, sessions_dir
from agent.turn import run_compact_task, run_task
from agent.unified_exec import NotTypable, UnifiedExecManager
from broker.net.runtime import sluice_home
from broker.wire.protocol import (
    NO_SESSION,
    STDIN_TYPED_MAX,
    TURN_INTERRUPTED,
    AddToHistory,
    AskForApproval,
    BackgroundEventEvent,
    Compact,
    ConfigureSession,
    ErrorEvent,
    Event,
    EventMsg,
    ExecApproval,
    ExecCommandStdin,
    ExecCommandStdinTypedEvent,
    GetHistoryEntryRequest,
    GetHistoryEntryResponseEvent,
    InputItem,
    Interrupt,
    PatchApproval,
    ReviewDecision,
    SessionConfiguredEvent,
    ShutdownCompleteEvent,
    Submission,
    TurnAbortedEvent,
    TurnAbortReason,
    UnifiedExecSettings,
    UserInput,
)
from landlock_helper.limits import Limits
from landlock_helper.policy import WRITE_FOLDER, DiskWriteFolder, SandboxPolicy

log = structlog.get_logger("agent.session")

DEFAULT_EXEC_TIMEOUT_MS = 10_000
# How long an interrupt waits for the task to unwind (cancel its command, report it)
# before announcing the abort.
ABORT_GRACE_S = 2.0

Emit = Callable[[Event], object]


@dataclass
class SessionConfig:
    """What ``configure_session`` set, resolved."""

    model: str
    provider: ResolvedProvider
    approval_policy: AskForApproval
    sandbox_policy: SandboxPolicy
    cwd: str
    instructions: str
    environment: EnvironmentContext
    """What the model is told of its environment (``<environment_context>``)."""
    notify: list[str] | None = None
    disable_response_storage: bool = False
    missing_key: str | None = None
    """Set when the provider needs a key and none came: the error to report."""
    reasoning: dict | None = None
    """The Responses API ``reasoning`` settings sent with every request (None: none)."""
    unified_exec: UnifiedExecSettings = field(default_factory=UnifiedExecSettings)
    """Which interactive tools the model gets, and their bounds."""


@dataclass(eq=False)
class AgentTask:
    """One task: a user turn (``kind`` "user") or a compaction ("compact")."""

    sub_id: str
    kind: str
    inputs: list[InputItem]
    handle: asyncio.Task[None] | None = None
    input_messages: list[str] = field(default_factory=list)
    running_calls: set[str] = field(default_factory=set)
    diff: TurnDiffTracker | None = None


@dataclass(eq=False)
class _PendingApproval:
    sub_id: str
    call_id: str
    future: asyncio.Future[ReviewDecision]


class Session:
    """One conversation; see the module docstring."""

    def __init__(
        self,
        emit: Emit,
        runner: CommandRunner,
        *,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        show_raw_agent_reasoning: bool = False,
        base_instructions: str | None = None,
        default_timeout_ms: int = DEFAULT_EXEC_TIMEOUT_MS,
        command_env: Mapping[str, str] | None = None,
        session_id: uuid.UUID | str | None = None,
    ) -> None:
        self._emit = emit
        self.runner = runner
        self.env = dict(os.environ if env is None else env)
        self.home = home if home is not None else Path(sluice_home(self.env))
        self.http_client = http_client
        self.backoff_base = backoff_base
        self.show_raw_agent_reasoning = show_raw_agent_reasoning
        # None: the built-in instructions for the session's tools.
        self.base_instructions = base_instructions
        self.default_timeout_ms = default_timeout_ms
        # The commands' environment: what the frontend sent with configure_session, else
        # this (None: the runner's, i.e. the agent's own), secrets filtered out by the runner.
        self._default_command_env = dict(command_env) if command_env is not None else None
        self.command_env = self._default_command_env
        self.command_env_passthrough: list[str] = []
        # Resource limits of the session's commands (ConfigureSession.limits); None: defaults.
        self.command_limits: Limits | None = None

        # The daemon names the session (a library user may leave it to us); resuming a
        # rollout takes the rollout's id instead, as in Codex.
        if session_id is None:
            self.session_id = uuid.uuid4()
        else:
            self.session_id = session_id if isinstance(session_id, uuid.UUID) else uuid.UUID(session_id)
        self.config: SessionConfig | None = None
        self.client: ModelClient | None = None
        self.rollout: RolloutRecorder | None = None
        self.history: list[Item] = []
        self.approved_commands: set[tuple[str, ...]] = set()
        self.granted_roots: list[str] = []
        self.closed = False

        self._task: AgentTask | None = None
        self._queued: list[AgentTask] = []
        self._pending_input: list[tuple[str, list[InputItem]]] = []
        self._approvals: dict[str, _PendingApproval] = {}
        self._secrets: list[str] = []
        self._submit_lock = asyncio.Lock()
        self._current_sub = ""  # the submission being handled
        # Long-lived commands (unified exec): they outlive turns and interrupts, and die
        # with the session (shutdown, aclose).
        self.unified_exec = UnifiedExecManager(runner, self.send)
        # The session's MCP servers (agent.mcp), from configure_session's mcp_servers.
        self.mcp: McpManager | None = None

    # -- events -----------------------------------------------------------------------

    def send(self, sub_id: str, msg: EventMsg) -> None:
        try:
            self._emit(Event(id=sub_id, msg=msg))
        except Exception:
            log.exception("emit failed", kind=type(msg).__name__)

    def error(self, sub_id: str, message: str) -> None:
        self.send(sub_id, ErrorEvent(message))

    # -- state the task loop uses -----------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None

    def record(self, items: list[Item]) -> None:
        """Add ``items`` to the conversation and the rollout."""
        self.history.extend(items)
        if self.rollout is not None:
            self.rollout.record_items(items)

    def replace_history(self, items: list[Item]) -> None:
        self.history = list(items)
        if self.rollout is not None:
            self.rollout.record_compaction(items)

    async def sync_rollout(self) -> None:
        """Put what the rollout holds on disk for good (at a turn's end)."""
        if self.rollout is not None:
            await self.rollout.sync()

    def _use_rollout(self, recorder: RolloutRecorder) -> None:
        self.rollout = recorder
        recorder.on_failure = self._rollout_failed

    def _rollout_failed(self, message: str) -> None:
        """The rollout can no longer be written: said once, to the running task (or the
        submission being handled); the session goes on without a record."""
        self.error(self._task.sub_id if self._task is not None else self._current_sub, message)

    @property
    def has_pending_input(self) -> bool:
        return bool(self._pending_input)

    def take_pending_input(self) -> list[list[InputItem]]:
        pending, self._pending_input = self._pending_input, []
        return [inputs for _, inputs in pending]

    @property
    def sandbox_policy(self) -> SandboxPolicy:
        """The session's policy plus the roots granted to patches this session."""
        assert self.config is not None
        policy = self.config.sandbox_policy
        if not self.granted_roots or policy.has_full_disk_write_access():
            return policy
        extra = [{WRITE_FOLDER: DiskWriteFolder(root)} for root in self.granted_roots]
        permissions = list(policy.permissions) + [p for p in extra if p not in policy.permissions]
        return SandboxPolicy(permissions)

    @property
    def unsandboxed_policy(self) -> SandboxPolicy:
        return SandboxPolicy.from_mode("danger-full-access")

    def grant_root(self, root: str) -> None:
        root = os.path.normpath(root)
        if root not in self.granted_roots:
            self.granted_roots.append(root)

    async def request_approval(self, task: AgentTask, call_id: str, msg: EventMsg) -> ReviewDecision:
        """Send an approval request and wait for the answer. An ``abort`` answer (or an
        interrupt) cancels the task, so this never returns ``abort``."""
        future: asyncio.Future[ReviewDecision] = asyncio.get_running_loop().create_future()
        self._approvals[task.sub_id] = _PendingApproval(task.sub_id, call_id, future)
        self.send(task.sub_id, msg)
        try:
            return await future
        finally:
            pending = self._approvals.get(task.sub_id)
            if pending is not None and pending.future is future:
                del self._approvals[task.sub_id]

    # -- submissions ------------------------------------------------------------------

    async def submit(self, sub: Submission) -> None:
        """Handle one submission (see the module docstring). Submissions are handled one
        at a time, in the order they are submitted, as Codex's submission loop does."""
        async with self._submit_lock:
            await self._handle(sub)

    async def _handle(self, sub: Submission) -> None:
        op = sub.op
        self._current_sub = sub.id
        if self.closed:
            self.error(sub.id, "the session is shut down")
            return
        if isinstance(op, ConfigureSession):
            await self._configure(sub.id, op)
        elif isinstance(op, AddToHistory):
            await self._add_to_history(op.text)
        elif isinstance(op, GetHistoryEntryRequest):
            await self._get_history_entry(sub.id, op)
        elif isinstance(op, Compact | Interrupt | UserInput | ExecApproval | PatchApproval | ExecCommandStdin) \
                and self.config is None:
            self.error(sub.id, NO_SESSION)
        elif isinstance(op, UserInput):
            self._user_input(sub.id, op.items)
        elif isinstance(op, Interrupt):
            await self.abort()
        elif isinstance(op, ExecApproval | PatchApproval):
            await self._approval(op.id, op.decision)
        elif isinstance(op, Compact):
            self._start_or_queue(AgentTask(sub.id, "compact", []))
        elif isinstance(op, ExecCommandStdin):
            self._type_into(sub.id, op)
        else:  # Shutdown
            await self._shutdown(sub.id)

    def _user_input(self, sub_id: str, items: list[InputItem]) -> None:
        task = self._task
        if task is not None and task.kind == "user":
            self._pending_input.append((sub_id, list(items)))
            task.input_messages.extend(input_texts(items))
            return
        self._start_or_queue(AgentTask(sub_id, "user", list(items)))

    def _type_into(self, sub_id: str, op: ExecCommandStdin) -> None:
        """A person types into a running command: announced to every frontend, then
        written as the model's ``write_stdin`` writes (see :mod:`agent.unified_exec`)."""
        if not op.stdin:
            self.error(sub_id, f"nothing to type into command {op.call_id}")
            return
        if len(op.stdin) > STDIN_TYPED_MAX:
            self.error(sub_id, f"{len(op.stdin)} characters are too many to type at once "
                               f"(at most {STDIN_TYPED_MAX}); nothing was typed")
            return
        try:
            session = self.unified_exec.typing_target(op.call_id)
        except NotTypable as err:
            self.error(sub_id, str(err))
            return
        self.send(sub_id, ExecCommandStdinTypedEvent.of(op))
        self.unified_exec.type(session, op.stdin.encode(), lambda: self.error(
            sub_id, f"command {op.call_id} ended before all that was typed was written"))

    def _start_or_queue(self, task: AgentTask) -> None:
        if self._task is None:
            self._start(task)
        elif task.kind == "user" and self._queued and self._queued[-1].kind == "user":
            # Input behind a compaction: one task takes all of it.
            self._queued[-1].inputs.extend(task.inputs)
        else:
            self._queued.append(task)

    def _start(self, task: AgentTask) -> None:
        self._task = task
        runner = run_compact_task if task.kind == "compact" else run_task
        task.handle = asyncio.get_running_loop().create_task(runner(self, task), name=f"task-{task.sub_id}")

    def task_finished(self, task: AgentTask) -> None:
        """Called by the task as it ends; starts what was queued behind it."""
        if self._task is not task:
            return
        self._task = None
        if self.closed:
            return
        if self._pending_input:
            # Input that arrived as the task was finishing: it starts the next task.
            leftover, self._pending_input = self._pending_input, []
            inputs = [item for _, items in leftover for item in items]
            self._queued.insert(0, AgentTask(leftover[0][0], "user", inputs))
        if self._queued:
            self._start(self._queued.pop(0))

    async def abort(self, reason: TurnAbortReason = TurnAbortReason.INTERRUPTED) -> None:
        """Cancel the running task (Codex's ``Session::abort``)."""
        self._pending_input.clear()
        self._queued.clear()
        for pending in self._approvals.values():
            pending.future.cancel()
        self._approvals.clear()
        task = self._task
        if task is None:
            return
        self._task = None
        for call_id in list(task.running_calls):
            with contextlib.suppress(Exception):
                await self.runner.cancel(call_id)
        if task.handle is not None and not task.handle.done():
            task.handle.cancel()
            await asyncio.wait([task.handle], timeout=ABORT_GRACE_S)
        await self.sync_rollout()
        self.error(task.sub_id, TURN_INTERRUPTED)
        self.send(task.sub_id, TurnAbortedEvent(reason))

    async def _approval(self, sub_id: str, decision: ReviewDecision) -> None:
        pending = self._approvals.get(sub_id)
        if pending is None:
            pending = next((p for p in self._approvals.values() if p.call_id == sub_id), None)
        if decision == ReviewDecision.ABORT:
            await self.abort()
            return
        if pending is None:
            log.info("approval for nothing pending ignored", id=sub_id)
            return
        if not pending.future.done():
            pending.future.set_result(ReviewDecision(decision))

    # -- configure --------------------------------------------------------------------

    async def _configure(self, sub_id: str, op: ConfigureSession) -> None:
        if not os.path.isabs(op.cwd):
            self.error(sub_id, f"cwd is not absolute: {op.cwd!r}")
            return
        cwd = os.path.normpath(op.cwd)
        if not os.path.isdir(cwd):
            self.error(sub_id, f"cwd is not a directory: {cwd!r}")
            return
        provider, missing_key = self._resolve_provider(op)
        resumed = None
        if isinstance(op.resume_path, str):
            try:
                resumed = await self._resume(op.resume_path)
            except RolloutError as err:
                # Never a fresh conversation in place of the one asked for: the configure
                # is refused, with why, and nothing changes.
                self.error(sub_id, f"could not resume the session: {err}")
                return
        await self.abort()
        if self.client is not None:
            await self.client.aclose()
            self.client = None

        errors: list[str] = []
        notes: list[str] = []
        restored: list[Item] | None = None
        if resumed is not None:
            recorder, saved = resumed
            if self.rollout is not None:
                await self.rollout.shutdown()
            self._use_rollout(recorder)
            # The session is the rollout's again, as in Codex; the daemon learns the id
            # from session_configured and addresses the session by it from then on.
            self.session_id = saved.session_id
            restored = saved.items
            report = saved.report(recorder.path)
            if report is not None:
                notes.append(report)

        if isinstance(op.env, dict):
            self.command_env = dict(op.env)
            self.command_env_passthrough = list(op.env_passthrough) if isinstance(op.env_passthrough, list) else []
        else:
            self.command_env = self._default_command_env
            self.command_env_passthrough = []
        self.command_limits = op.limits if isinstance(op.limits, Limits) else None
        unified_exec = op.unified_exec if isinstance(op.unified_exec, UnifiedExecSettings) else UnifiedExecSettings()
        self.unified_exec.configure(max_sessions=unified_exec.max_sessions,
                                    idle_timeout_s=unified_exec.idle_timeout_ms / 1000)
        if isinstance(op.user_instructions, str):
            user: str | None = op.user_instructions or None  # the frontend's, AGENTS.md included
        else:
            # Read as a command of this session would read them (its sandbox, its view).
            files = SandboxFiles(self.runner, op.sandbox_policy, cwd, limits=self.command_limits,
                                 timeout_ms=PROJECT_DOC_TIMEOUT_MS)
            user = await user_instructions(op.instructions, cwd, files)
        base = op.base_instructions if isinstance(op.base_instructions, str) and op.base_instructions \
            else self.base_instructions or base_instructions(unified_exec.tools)
        sandbox_policy = op.sandbox_policy
        previous = self.config.environment if self.config is not None and restored is None else None
        self.config = SessionConfig(
            model=op.model,
            provider=provider,
            approval_policy=AskForApproval(op.approval_policy),
            sandbox_policy=sandbox_policy,
            cwd=cwd,
            instructions=full_instructions(user, base),
            environment=EnvironmentContext.of(cwd, AskForApproval(op.approval_policy), sandbox_policy, user_shell()),
            notify=list(op.notify) if isinstance(op.notify, list) and op.notify else None,
            disable_response_storage=op.disable_response_storage,
            missing_key=missing_key,
            reasoning=reasoning_param(
                op.model,
                op.model_reasoning_effort if isinstance(op.model_reasoning_effort, str) else None,
                op.model_reasoning_summary if isinstance(op.model_reasoning_summary, str) else None,
            ),
            unified_exec=unified_exec,
        )
        if isinstance(op.show_raw_agent_reasoning, bool):
            self.show_raw_agent_reasoning = op.show_raw_agent_reasoning
        if self.rollout is None:
            try:
                self._use_rollout(await RolloutRecorder.create(
                    self.session_id, instructions=user, root=sessions_dir(home=self.home), secrets=self._secrets
                ))
            except RolloutError as err:
                log.warning("no rollout for this session", error=str(err))
                errors.append(str(err))
        if restored is not None:
            self.history = list(restored)
        self._tell_environment(previous)

        self.client = ModelClient(
            provider,
            model=op.model,
            disable_response_storage=op.disable_response_storage,
            session_id=str(self.session_id),
            backoff_base=self.backoff_base,
            http_client=self.http_client,
        )
        log.info("session configured", session_id=str(self.session_id), model=op.model, provider=repr(provider),
                 cwd=cwd, approval_policy=str(op.approval_policy), resumed=restored is not None)
        mcp_errors = await self._start_mcp(op, sandbox_policy, cwd)
        log_id, count = await asyncio.to_thread(message_history.history_metadata, self._history_path)
        self.send(sub_id, SessionConfiguredEvent(self.session_id, op.model, log_id, count))
        for server in self.mcp.servers if self.mcp is not None else ():
            granted = grants(server)
            if granted:
                self.send(sub_id, BackgroundEventEvent(f"MCP server {server.name} runs with {' and '.join(granted)} "
                                                       "(its configuration asks for it)"))
        for note in [*notes, *(self.mcp.notes if self.mcp is not None else ())]:
            self.send(sub_id, BackgroundEventEvent(note))
        for message in [*errors, *mcp_errors]:
            self.error(sub_id, message)

    def _tell_environment(self, previous: EnvironmentContext | None) -> None:
        """Put the environment into the conversation, as Codex does: what changed since
        ``previous`` (what this session last told the model), else the whole context
        unless the last one in the conversation (a resumed one, say) is exactly this."""
        current = self.config.environment
        if previous is not None:
            changed = current.diff(previous)
            if changed is not None:
                self.record([changed.item()])
            return
        told = next((item for item in reversed(self.history) if is_environment_context(item)), None)
        if told != current.item():
            self.record([current.item()])

    def environment_item(self) -> Item:
        """The whole environment context, for a conversation that starts over (compaction)."""
        return self.config.environment.item()

    async def _resume(self, path: str) -> tuple[RolloutRecorder, SavedSession]:
        """The rollout at ``path``, opened to go on recording in it, and what it holds;
        raises :class:`RolloutError`."""
        if self.rollout is not None and _same_file(self.rollout.path, path):
            await self.rollout.shutdown()  # its own rollout again: let go of it first
            self.rollout = None
        return await RolloutRecorder.resume(path, secrets=self._secrets)

    async def _start_mcp(self, op: ConfigureSession, sandbox_policy: SandboxPolicy, cwd: str) -> list[str]:
        """Start the session's MCP servers (those of a previous configure are stopped); the
        ones that fail are reported after ``session_configured`` and left out."""
        if self.mcp is not None:
            await self.mcp.aclose()
            self.mcp = None
        servers = op.mcp_servers if isinstance(op.mcp_servers, list) else []
        if not servers:
            return []
        launcher = sandboxed_launcher(self.runner, session_policy=sandbox_policy, cwd=cwd, sandbox_cwd=cwd,
                                      env=self.command_env, env_passthrough=self.command_env_passthrough,
                                      limits=self.command_limits)
        self.mcp = McpManager(servers, launcher, roots=[cwd])
        errors = await self.mcp.start()
        log.info("MCP servers started", servers=[s.name for s in servers], failed=len(errors), tools=len(self.mcp.tools))
        return errors

    def _resolve_provider(self, op: ConfigureSession) -> tuple[ResolvedProvider, str | None]:
        key = op.api_key if isinstance(op.api_key, str) and op.api_key else None
        env_key = op.provider.env_key
        if key is None and env_key:
            key = (self.env.get(env_key) or "").strip() or None
        missing = None
        if key is None and env_key:
            hint = f" ({op.provider.env_key_instructions})" if op.provider.env_key_instructions else ""
            missing = f"missing API key: set {env_key}{hint}"
        if key is not None:
            if key not in self._secrets:
                self._secrets.append(key)
            if self.rollout is not None:
                self.rollout.add_secret(key)
        info = op.provider
        if not info.base_url:  # None means the provider's default endpoint
            info = msgspec.structs.replace(info, base_url=OPENAI_DEFAULT_BASE_URL)
        return ResolvedProvider.from_info(info, key), missing

    # -- history ----------------------------------------------------------------------

    @property
    def _history_path(self) -> Path:
        return message_history.history_path(home=self.home)

    async def _add_to_history(self, text: str) -> None:
        try:
            await asyncio.to_thread(message_history.append_entry, text, str(self.session_id), self._history_path)
        except OSError as err:
            log.warning("could not append to the message history", error=str(err))

    async def _get_history_entry(self, sub_id: str, op: GetHistoryEntryRequest) -> None:
        entry = await asyncio.to_thread(message_history.lookup, op.log_id, op.offset, self._history_path)
        self.send(sub_id, GetHistoryEntryResponseEvent(op.offset, op.log_id, entry))

    # -- ending -----------------------------------------------------------------------

    async def _shutdown(self, sub_id: str) -> None:
        await self.abort()
        self.closed = True
        await self.unified_exec.close_all()
        if self.mcp is not None:
            await self.mcp.aclose()
        if self.rollout is not None:
            await self.rollout.shutdown()  # a failure to sync is reported by the recorder
            self.rollout = None
        if self.client is not None:
            await self.client.aclose()
            self.client = None
        self.send(sub_id, ShutdownCompleteEvent())

    async def aclose(self) -> None:
        """Stop without the events of a shutdown: abort, flush, close."""
        self.closed = True
        task = self._task
        self._task = None
        self._queued.clear()
        if task is not None and task.handle is not None and not task.handle.done():
            task.handle.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task.handle
        await self.unified_exec.close_all()
        if self.mcp is not None:
            await self.mcp.aclose()
        if self.rollout is not None:
            await self.rollout.shutdown()
            self.rollout = None
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    async def wait_idle(self) -> None:
        """Wait until no task runs and none is queued (for tests and one-shot frontends)."""
        while self._task is not None:
            handle = self._task.handle
            if handle is None:
                return
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(handle)
            await asyncio.sleep(0)


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
