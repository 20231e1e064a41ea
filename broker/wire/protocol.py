"""The Codex submission/event protocol as msgspec Structs, and its JSON and msgpack codecs.

A frontend sends :class:`Submission` ``{"id", "op"}``; the agent answers with
:class:`Event` ``{"id", "msg"}`` whose ``id`` is the submission it belongs to. ``op`` and
``msg`` are unions tagged by a ``"type"`` field in snake_case, exactly as Codex's serde
enums (``#[serde(tag = "type", rename_all = "snake_case")]``) spell them::

    {"id":"1","op":{"type":"user_input","items":[{"type":"text","text":"hi"}]}}
    {"id":"1","msg":{"type":"exec_command_begin","call_id":"c1","command":["ls"],"cwd":"/w"}}

The JSON form matches Codex's byte for byte: keys in field order, compact separators,
the same string escapes. Optional fields follow serde: an ``Option`` that Codex marks
``skip_serializing_if = "Option::is_none"`` is left out when unset, any other ``Option``
is written as ``null``. Structs whose every defaulted field is such a skipped one set
``omit_defaults``; :class:`ConfigureSession`, which also has fields Codex always writes,
marks its skipped fields with ``msgspec.UNSET`` instead. A Struct with a defaulted
field before a required one is keyword-only, so the field order stays Codex's.

Policies are kebab-case strings (:class:`AskForApproval`; the sandbox permissions too).
The sandbox policy is the sandbox's own type, :class:`landlock_helper.policy.SandboxPolicy`:
a dataclass whose fields are Codex's JSON (a permission is a bare string or
``{"disk-write-folder": {"folder": "/p"}}``), which msgspec encodes and validates like
a Struct, its folder permission through :func:`broker.wire.frames.dec_hook`.

A file change, a Codex enum that serde tags *externally* (a shape msgspec has no Struct
union for), is ``"delete"``, ``{"add": {"content"}}`` or
``{"update": {"unified_diff", "move_path"}}``; its variants (:class:`AddFileChange`,
:class:`DeleteFileChange`, :class:`UpdateFileChange`) are plain classes that the codec
functions below convert, so encode and decode through them, not through ``msgspec.json``
directly.

JSON is for people and other programs: ``sluice run --json``, the stdio bridge and
rollout files. Between sluice's own processes the same Structs travel as msgpack (maps
keyed by field name, so both forms carry the same information). Output chunks are
``bytes``: raw in msgpack, base64 in JSON, as later Codex writes them.

Which Codex: the later ``codex-rs/core/src/protocol.rs`` (the one with
``ConfigureSession``, the permission-list ``SandboxPolicy`` and ``SessionConfiguredEvent``),
plus the events later Codex added and its ``codex.rs`` emits: message and reasoning
deltas, ``token_count``, ``exec_command_output_delta``, the ``exec_command_end`` with
``duration`` and formatted output, ``turn_diff``, ``plan_update``, ``turn_aborted``,
``shutdown_complete``, and the ``Compact``/``Shutdown`` ops. Two fields are sluice's own,
written only when set: ``Event.seq``, the per-session sequence number, and
``ConfigureSession.api_key``, the provider key the frontend resolved. sluice's own
messages (:class:`ExecCommandStdin`, :class:`ApprovalResolvedEvent`,
:class:`ExecCommandStdinTypedEvent`) say so in their docstrings.
"""

from __future__ import annotations

import enum
import math
import re
import uuid
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

from broker.wire import frames
from landlock_helper.limits import Limits
from landlock_helper.policy import SandboxPolicy


class ProtocolError(frames.WireError):
    """A message that is not valid protocol; the message says what was wrong."""


# -- policies and small enums ---------------------------------------------------------


# Codex's own error messages, as frontends see them.
NO_SESSION = "No session initialized, expected 'ConfigureSession' as first Op"
TURN_INTERRUPTED = "Turn interrupted"  # before the turn_aborted of an interrupted turn
# sluice's own: how the error that the session's rollout file can no longer be written
# begins ("rollout: no space left on device: PATH"). The session goes on: it ends no turn.
ROLLOUT_ERROR_PREFIX = "rollout: "
# Codex's reason for the approval asked after a sandboxed command failed the way sandbox
# denials fail; frontends show it as sluice's words, any other reason as the model's.
RETRY_WITHOUT_SANDBOX_REASON = "command failed; retry without sandbox?"


def is_rollout_error(message: str) -> bool:
    return message.startswith(ROLLOUT_ERROR_PREFIX)


class AskForApproval(enum.StrEnum):
    """When the user is asked before a command runs."""

    UNTRUSTED = "untrusted"
    """Ask for everything except known-safe, read-only commands."""
    ON_FAILURE = "on-failure"
    """Run everything sandboxed; ask to rerun unsandboxed when a command fails."""
    ON_REQUEST = "on-request"
    """Run everything sandboxed; the model asks when it needs more."""
    NEVER = "never"
    """Never ask; failures go straight back to the model."""


# Names older Codex configs use for the same policies. Early Codex declared auto-edit
# ("in addition to the known-safe commands, writes within the writable roots are
# auto-approved") without implementing it. on-request is what later Codex offers for
# that: edits and commands confined to the writable roots run without asking, and
# leaving them (escalation, a patch outside the roots) asks first. on-failure would
# ask only after the fact, untrusted would ask for every edit.
_APPROVAL_ALIASES = {
    "unless-allow-listed": AskForApproval.UNTRUSTED,
    "auto-edit": AskForApproval.ON_REQUEST,
}


# ``ConfigureSession.approval_policy`` is decoded as a string and made an
# :class:`AskForApproval` by the Struct's ``__post_init__``, so that the seeds' older names
# (``unless-allow-listed``, ``auto-edit``) are taken as the aliases they are; encoding
# writes the policy's own name. Type checkers see the enum.
# ``ConfigureSession.sandbox_policy`` likewise takes a mode name (``"workspace-write"``)
# as well as the permission list, as :meth:`SandboxPolicy.from_json` does, and its
# ``__post_init__`` makes it the policy: what crosses the wire onwards is the list.
if TYPE_CHECKING:
    WireApprovalPolicy = AskForApproval
    WireSandboxPolicy = SandboxPolicy
else:
    WireApprovalPolicy = str
    WireSandboxPolicy = SandboxPolicy | str


def parse_approval_policy(value: str) -> AskForApproval:
    """The approval policy a person typed, accepting older Codex names."""
    if value in _APPROVAL_ALIASES:
        return _APPROVAL_ALIASES[value]
    try:
        return AskForApproval(value)
    except ValueError:
        choices = ", ".join(AskForApproval)
        raise ValueError(f"approval policy {value!r} is unknown; use one of {choices}") from None


class ReviewDecision(enum.StrEnum):
    """A person's answer to an approval request."""

    APPROVED = "approved"
    APPROVED_FOR_SESSION = "approved_for_session"
    """Approve this and identical requests (same command and cwd) for the session."""
    DENIED = "denied"
    """Do not run it, but let the agent carry on."""
    ABORT = "abort"
    """Do not run it, and stop the task until the next input."""


class WireApi(enum.StrEnum):
    """Which OpenAI-style API a model provider speaks."""

    RESPONSES = "responses"
    CHAT = "chat"


class ExecOutputStream(enum.StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"


class StepStatus(enum.StrEnum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class ReasoningEffort(enum.StrEnum):
    """How hard a reasoning model thinks (``model_reasoning_effort``); ``none`` sends no
    reasoning settings at all."""

    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    NONE = "none"


class ReasoningSummary(enum.StrEnum):
    """What summary of its reasoning a model is asked for (``model_reasoning_summary``)."""

    AUTO = "auto"
    CONCISE = "concise"
    DETAILED = "detailed"
    NONE = "none"


class TurnAbortReason(enum.StrEnum):
    INTERRUPTED = "interrupted"
    REPLACED = "replaced"
    """A new task took the running one's place."""


# -- file changes (serde externally tagged, converted by the codec hooks) -------------


class FileChange:
    """One file's change in a patch: :class:`AddFileChange`, :class:`DeleteFileChange`
    or :class:`UpdateFileChange`."""

    __slots__ = ()
    tag: ClassVar[str]

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def to_builtins(self) -> str | dict[str, dict[str, Any]]:
        """Codex's JSON value: the bare tag for a unit variant, else ``{tag: {fields}}``."""
        if not self.__slots__:
            return self.tag
        return {self.tag: {name: getattr(self, name) for name in self.__slots__}}

    @staticmethod
    def from_builtins(value: Any) -> FileChange:
        """The variant for Codex's JSON value, as decoded to builtins."""
        match value:
            case "delete":
                return DeleteFileChange()
            case {"add": {"content": str(content)}} if len(value) == 1:
                return AddFileChange(content)
            case {"update": {"unified_diff": str(unified_diff)} as body} if len(value) == 1:
                move_path = body.get("move_path")
                if isinstance(move_path, str | None):
                    return UpdateFileChange(unified_diff, move_path)
        raise ValueError(
            'a file change is "delete", {"add": {"content": ...}} '
            'or {"update": {"unified_diff": ..., "move_path": ...}}'
        )


class AddFileChange(FileChange):
    __slots__ = ("content",)
    __match_args__ = ("content",)
    tag = "add"

    def __init__(self, content: str) -> None:
        self.content = content


class DeleteFileChange(FileChange):
    __slots__ = ()
    tag = "delete"


class UpdateFileChange(FileChange):
    __slots__ = ("unified_diff", "move_path")
    __match_args__ = ("unified_diff", "move_path")
    tag = "update"

    def __init__(self, unified_diff: str, move_path: str | None = None) -> None:
        self.unified_diff = unified_diff
        self.move_path = move_path


# -- values inside messages -----------------------------------------------------------


class Duration(msgspec.Struct):
    """A span of time in serde's shape for Rust's ``std::time::Duration``."""

    secs: Annotated[int, msgspec.Meta(ge=0)]
    nanos: Annotated[int, msgspec.Meta(ge=0, lt=1_000_000_000)]

    @classmethod
    def from_seconds(cls, seconds: float) -> Duration:
        """The duration nearest to ``seconds``, to the nanosecond."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"a duration is a finite number of seconds >= 0, got {seconds!r}")
        secs, nanos = divmod(round(seconds * 1_000_000_000), 1_000_000_000)
        return cls(secs, nanos)

    @property
    def seconds(self) -> float:
        return self.secs + self.nanos / 1_000_000_000


class ModelProviderInfo(msgspec.Struct):
    """Where the model lives and how to reach it (Codex's provider entry)."""

    name: str
    base_url: str | None = None
    """None means the provider's default endpoint."""
    env_key: str | None = None
    """Environment variable holding the API key."""
    env_key_instructions: str | None = None
    wire_api: WireApi = WireApi.CHAT
    query_params: dict[str, str] | None = None
    http_headers: dict[str, str] | None = None
    env_http_headers: dict[str, str] | None = None
    """Header name -> environment variable holding its value."""
    request_max_retries: int | None = None
    stream_max_retries: int | None = None
    stream_idle_timeout_ms: int | None = None
    requires_openai_auth: bool = False


class HistoryEntry(msgspec.Struct):
    """One line of the cross-session message history."""

    session_id: str
    ts: int
    text: str


class PlanItem(msgspec.Struct):
    step: str
    status: StepStatus


class CallToolResult(msgspec.Struct, omit_defaults=True):
    """An MCP tool's result; ``content`` items are MCP content objects, kept as JSON."""

    content: list[dict[str, Any]]
    is_error: bool | None = msgspec.field(default=None, name="isError")
    structured_content: Any = msgspec.field(default=None, name="structuredContent")


# -- input items ----------------------------------------------------------------------


class _InputItem(msgspec.Struct, tag_field="type"):
    pass


class TextInput(_InputItem, tag="text"):
    text: str


class ImageInput(_InputItem, tag="image"):
    image_url: str
    """A ``data:`` URI."""


class LocalImageInput(_InputItem, tag="local_image"):
    path: str


InputItem = TextInput | ImageInput | LocalImageInput


# -- submissions ----------------------------------------------------------------------


class _Op(msgspec.Struct, tag_field="type"):
    pass


UNIFIED_EXEC_TOOLS = ("off", "seed", "codex")


class UnifiedExecSettings(msgspec.Struct, frozen=True, kw_only=True):
    """sluice's own: the long-lived commands the model may run (the ``unified_exec``
    keys of the frontend's config)."""

    tools: str = "seed"
    """Which tools the model is offered: ``off`` (``shell`` only), ``seed`` (the seed's
    ``unified_exec`` beside ``shell``), ``codex`` (``exec_command`` and ``write_stdin``
    instead of ``shell``); one of :data:`UNIFIED_EXEC_TOOLS`. The default, ``seed``,
    only adds a tool: a model that knows nothing but ``shell`` loses nothing."""
    max_sessions: int = 64
    """Live sessions per agent session; one more closes the one idle longest."""
    idle_timeout_ms: int = 30 * 60 * 1000
    """A session no call used for this long is closed; 0: never."""

    def __post_init__(self) -> None:
        if self.tools not in UNIFIED_EXEC_TOOLS:
            raise msgspec.ValidationError(f"unified_exec must be one of {', '.join(UNIFIED_EXEC_TOOLS)}, "
                                          f"got {self.tools!r}")
        if self.max_sessions < 1:
            raise msgspec.ValidationError(f"unified_exec_max_sessions must be at least 1, got {self.max_sessions}")
        if self.idle_timeout_ms < 0:
            raise msgspec.ValidationError(f"unified_exec_idle_timeout_ms must be >= 0, got {self.idle_timeout_ms}")


class McpServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """sluice's own: one MCP server a session starts (the frontend's ``[mcp_servers.NAME]``,
    see :mod:`agent.mcp.config`). It runs in the sandbox: the session's policy without
    network unless ``network``, ``writable_roots`` or ``sandbox`` (a mode) say more."""

    name: str
    command: str
    args: list[str] = []
    env: dict[str, str] = {}
    startup_timeout_s: float = 10.0
    tool_timeout_s: float = 60.0
    network: bool = False
    writable_roots: list[str] = []
    sandbox: str | None = None
    """None: the session's sandbox mode."""
    cwd: str | None = None
    """None: the session's cwd."""

    @property
    def argv(self) -> list[str]:
        return [self.command, *self.args]

    def __repr__(self) -> str:
        return f"McpServerConfig(name={self.name!r}, command={self.command!r}, env=<{len(self.env)} variables>)"


class ConfigureSession(_Op, tag="configure_session", kw_only=True):
    """Configure the session; the agent answers with ``session_configured``."""

    provider: ModelProviderInfo
    model: str
    model_reasoning_effort: ReasoningEffort | UnsetType = UNSET
    """Unset: the default, ``medium``, for models that reason."""
    model_reasoning_summary: ReasoningSummary | UnsetType = UNSET
    """Unset: the default, ``auto``."""
    user_instructions: str | UnsetType = UNSET
    """The later Codex's name for the user's instructions, as the frontend already put
    them together (with ``AGENTS.md``): taken as they are. When set, ``instructions`` and
    the project docs are not read."""
    base_instructions: str | UnsetType = UNSET
    """Replaces the built-in instructions (Codex's ``base_instructions`` override)."""
    instructions: str | None = None
    """The earlier Codex's user instructions; ``AGENTS.md`` found from ``cwd`` is added."""
    approval_policy: WireApprovalPolicy
    sandbox_policy: WireSandboxPolicy
    disable_response_storage: bool = False
    """Send the full context with every request instead of relying on stored responses."""
    # Codex leaves notify and resume_path out when unset but writes the fields above
    # even when empty, so these two are UNSET (never written) rather than None.
    notify: list[str] | UnsetType = UNSET
    """A program (argv) to run after each completed turn."""
    cwd: str
    """Absolute; relative paths from the model and the sandbox resolve against it."""
    resume_path: str | UnsetType = UNSET
    """A rollout file to resume from."""
    api_key: str | UnsetType = UNSET
    """sluice's own: the provider's API key as the frontend resolved it from its own
    environment (Codex reads it in-process). Never written when unset, hidden by
    ``repr``; the agent keeps it out of logs and rollout files."""
    env: dict[str, str] | UnsetType = UNSET
    """sluice's own: the environment of the session's commands, as the frontend built it
    from its own under its ``shell_environment_policy`` (secrets already out). Unset: the
    agent's own environment, filtered. Never written when unset; ``repr`` shows only how
    many variables it holds."""
    env_passthrough: list[str] | UnsetType = UNSET
    """sluice's own: names in ``env`` that look secret but the user's policy keeps on
    purpose (``set``, ``ignore_default_excludes``); the executor lets them through."""
    show_raw_agent_reasoning: bool | UnsetType = UNSET
    """sluice's own (Codex reads it from its config in-process): also emit the model's
    raw reasoning text, as ``agent_reasoning_raw_content`` events."""
    limits: Limits | UnsetType = UNSET
    """sluice's own: the resource limits of the session's commands (the ``[limits]``
    table of the frontend's config); unset fields take the executor's defaults."""
    unified_exec: UnifiedExecSettings | UnsetType = UNSET
    """sluice's own: the interactive tools offered and their bounds; unset: the defaults."""
    mcp_servers: list[McpServerConfig] | UnsetType = UNSET
    """sluice's own: the MCP servers whose tools the session offers (the frontend's
    ``[mcp_servers]``; Codex reads them from its config in-process)."""

    def __post_init__(self) -> None:
        self.approval_policy = parse_approval_policy(self.approval_policy)
        if isinstance(self.sandbox_policy, str):
            self.sandbox_policy = SandboxPolicy.from_json(self.sandbox_policy)

    def __repr__(self) -> str:
        def shown(name: str, value: object) -> str:
            if value is UNSET:
                return repr(value)
            if name == "api_key":
                return "<hidden>"
            if name == "env":
                return f"<{len(value)} variables>"  # type: ignore[arg-type]
            if name == "mcp_servers":
                return repr([server.name for server in value])  # type: ignore[union-attr]
            return repr(value)

        fields = ", ".join(f"{f}={shown(f, getattr(self, f))}" for f in self.__struct_fields__)
        return f"ConfigureSession({fields})"


class UserInput(_Op, tag="user_input"):
    items: list[InputItem]


class Interrupt(_Op, tag="interrupt"):
    """Abort the running task; the agent answers with ``turn_aborted``."""


class ExecApproval(_Op, tag="exec_approval"):
    id: str
    """The id of the submission whose request this answers."""
    decision: ReviewDecision


class PatchApproval(_Op, tag="patch_approval"):
    id: str
    decision: ReviewDecision


class AddToHistory(_Op, tag="add_to_history"):
    text: str


class GetHistoryEntryRequest(_Op, tag="get_history_entry_request"):
    offset: int
    log_id: int


class Compact(_Op, tag="compact"):
    """Summarise the conversation so far to free context."""


class Shutdown(_Op, tag="shutdown"):
    """Stop the session; the agent answers with ``shutdown_complete``."""


# How much one exec_command_stdin may type (characters), and how much of it the
# exec_command_stdin_typed event that announces it carries.
STDIN_TYPED_MAX = 64 * 1024
STDIN_TYPED_SHOWN = 1024


class ExecCommandStdin(_Op, tag="exec_command_stdin", omit_defaults=True):
    """sluice's own op, not Codex's: a person types into one of the session's running
    interactive commands (an ``exec_command`` / ``unified_exec`` session), named by the
    ``call_id`` of its ``exec_command_begin``.

    The agent writes ``stdin`` to the command's stdin as the model's ``write_stdin`` would,
    announcing it first to every frontend (``exec_command_stdin_typed``); an unknown or
    ended command, or one without stdin, gets an ``error`` and nothing is written. Only a
    frontend attached to the session may send it. No approval is asked: the command runs
    already, and what a person types is the person's act (as with ``sluice run -i``)."""

    call_id: str
    stdin: str
    """The text, exactly as it is written (a newline included if one is to be sent);
    at most :data:`STDIN_TYPED_MAX` characters."""
    by: str = ""
    """Set by the daemon to the frontend that sent it; what a frontend puts here is replaced."""


Op = (
    ConfigureSession
    | Interrupt
    | UserInput
    | ExecApproval
    | PatchApproval
    | AddToHistory
    | GetHistoryEntryRequest
    | Compact
    | Shutdown
    | ExecCommandStdin
)


class Submission(msgspec.Struct):
    id: str
    """Chosen by the sender; the events this causes carry it."""
    op: Op


# -- events ---------------------------------------------------------------------------


class _EventMsg(msgspec.Struct, tag_field="type"):
    pass


class ErrorEvent(_EventMsg, tag="error"):
    message: str


class TaskStartedEvent(_EventMsg, tag="task_started"):
    pass


class TaskCompleteEvent(_EventMsg, tag="task_complete"):
    last_agent_message: str | None = None


class TokenCountEvent(_EventMsg, tag="token_count", kw_only=True):
    input_tokens: int
    cached_input_tokens: int | None = None
    output_tokens: int
    reasoning_output_tokens: int | None = None
    total_tokens: int


class AgentMessageEvent(_EventMsg, tag="agent_message"):
    message: str


class UserMessageEvent(_EventMsg, tag="user_message", omit_defaults=True):
    """What the user asked (later Codex's ``user_message``): the text of one
    ``user_input``, its parts joined by newlines, and its images (``data:`` URIs, or the
    paths of local ones) when there are any."""

    message: str
    images: list[str] | None = None


class AgentMessageDeltaEvent(_EventMsg, tag="agent_message_delta"):
    delta: str


class AgentReasoningEvent(_EventMsg, tag="agent_reasoning"):
    text: str


class AgentReasoningDeltaEvent(_EventMsg, tag="agent_reasoning_delta"):
    delta: str


class AgentReasoningRawContentEvent(_EventMsg, tag="agent_reasoning_raw_content"):
    text: str


class AgentReasoningRawContentDeltaEvent(_EventMsg, tag="agent_reasoning_raw_content_delta"):
    delta: str


class SessionConfiguredEvent(_EventMsg, tag="session_configured"):
    session_id: uuid.UUID
    model: str
    history_log_id: int
    """Identifies the history file (its inode on Unix)."""
    history_entry_count: int


class McpToolCallBeginEvent(_EventMsg, tag="mcp_tool_call_begin"):
    call_id: str
    server: str
    tool: str
    arguments: Any = None


class McpToolCallEndEvent(_EventMsg, tag="mcp_tool_call_end"):
    call_id: str
    success: bool
    result: CallToolResult | None = None


class ExecCommandBeginEvent(_EventMsg, tag="exec_command_begin"):
    call_id: str
    command: list[str]
    cwd: str


class ExecCommandOutputDeltaEvent(_EventMsg, tag="exec_command_output_delta"):
    call_id: str
    stream: ExecOutputStream
    chunk: bytes
    """Raw output, not necessarily UTF-8."""


class ExecCommandEndEvent(_EventMsg, tag="exec_command_end", kw_only=True):
    call_id: str
    stdout: str
    stderr: str
    aggregated_output: str = ""
    """stdout and stderr interleaved as they came."""
    exit_code: int
    duration: Duration
    formatted_output: str
    """The output as the model sees it."""


class ExecApprovalRequestEvent(_EventMsg, tag="exec_approval_request", omit_defaults=True):
    call_id: str
    command: list[str]
    cwd: str
    reason: str | None = None
    """The model's justification, or :data:`RETRY_WITHOUT_SANDBOX_REASON`."""
    # sluice's own, omitted when unset (Codex's shape is unchanged then):
    interactive: bool = False
    """Approved, ``command`` keeps running as a session the model types into."""
    stdin: str | None = None
    """Set when what is asked is input for the running unsandboxed session ``process_id``
    (whose command and cwd these are): its text, exactly as it would be written."""
    process_id: str | None = None
    """The session's id, as the model names it (Codex's later name for it)."""


class ApplyPatchApprovalRequestEvent(
    _EventMsg, tag="apply_patch_approval_request", omit_defaults=True
):
    call_id: str
    changes: dict[str, FileChange]
    reason: str | None = None
    grant_root: str | None = None
    """Asks to allow writes beneath this root for the rest of the session."""


class BackgroundEventEvent(_EventMsg, tag="background_event"):
    message: str


class PatchApplyBeginEvent(_EventMsg, tag="patch_apply_begin"):
    call_id: str
    auto_approved: bool
    """True when nobody was asked (no ``apply_patch_approval_request``)."""
    changes: dict[str, FileChange]


class PatchApplyEndEvent(_EventMsg, tag="patch_apply_end"):
    call_id: str
    stdout: str
    stderr: str
    success: bool


class TurnDiffEvent(_EventMsg, tag="turn_diff"):
    unified_diff: str


class GetHistoryEntryResponseEvent(_EventMsg, tag="get_history_entry_response", omit_defaults=True):
    offset: int
    log_id: int
    entry: HistoryEntry | None = None


class PlanUpdateEvent(_EventMsg, tag="plan_update", kw_only=True):
    explanation: str | None = None
    plan: list[PlanItem]


class TurnAbortedEvent(_EventMsg, tag="turn_aborted"):
    reason: TurnAbortReason


class ShutdownCompleteEvent(_EventMsg, tag="shutdown_complete"):
    pass


class ApprovalResolvedEvent(_EventMsg, tag="approval_resolved"):
    """sluice's own event, not Codex's: an approval request was answered.

    Several frontends may be attached when a request comes; the first answer wins and
    this event (from the daemon, with the request's ``id``) tells every frontend which
    answer that was and who gave it, so the others stop asking.
    """

    call_id: str
    decision: ReviewDecision
    by: str
    """The frontend that answered, e.g. ``frontend-7 (sluice attach)``."""


class ExecCommandStdinTypedEvent(_EventMsg, tag="exec_command_stdin_typed", omit_defaults=True):
    """sluice's own event, not Codex's: a frontend typed into the running command
    ``call_id`` (an ``exec_command_stdin``), announced to every frontend before it is
    written. Frontends show it to people as an escaped, bounded line: ``stdin`` is the
    command's input, not text meant for a terminal."""

    call_id: str
    stdin: str
    """What was typed: its first :data:`STDIN_TYPED_SHOWN` characters."""
    by: str
    """The frontend that typed it, e.g. ``frontend-7 (sluice web)``."""
    omitted: int = 0
    """How many characters after those were typed too."""

    @classmethod
    def of(cls, op: ExecCommandStdin) -> ExecCommandStdinTypedEvent:
        shown = op.stdin[:STDIN_TYPED_SHOWN]
        return cls(op.call_id, shown, op.by, len(op.stdin) - len(shown))


EventMsg = (
    ErrorEvent
    | TaskStartedEvent
    | TaskCompleteEvent
    | TokenCountEvent
    | AgentMessageEvent
    | UserMessageEvent
    | AgentMessageDeltaEvent
    | AgentReasoningEvent
    | AgentReasoningDeltaEvent
    | AgentReasoningRawContentEvent
    | AgentReasoningRawContentDeltaEvent
    | SessionConfiguredEvent
    | McpToolCallBeginEvent
    | McpToolCallEndEvent
    | ExecCommandBeginEvent
    | ExecCommandOutputDeltaEvent
    | ExecCommandEndEvent
    | ExecApprovalRequestEvent
    | ApplyPatchApprovalRequestEvent
    | BackgroundEventEvent
    | PatchApplyBeginEvent
    | PatchApplyEndEvent
    | TurnDiffEvent
    | GetHistoryEntryResponseEvent
    | PlanUpdateEvent
    | TurnAbortedEvent
    | ShutdownCompleteEvent
    | ApprovalResolvedEvent
    | ExecCommandStdinTypedEvent
)


class Event(msgspec.Struct, omit_defaults=True):
    id: str
    """The submission this event belongs to."""
    msg: EventMsg
    seq: int | None = None
    """Position in the session's event log; written only when set."""


# -- codec ----------------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, FileChange):
        return obj.to_builtins()
    raise NotImplementedError(f"cannot encode {type(obj).__name__} as protocol")


def _dec_hook(type_: type, obj: Any) -> Any:
    if type_ is FileChange:
        return FileChange.from_builtins(obj)
    return frames.dec_hook(type_, obj)  # the sandbox policy's folder permission


_json_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_msgpack_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_submission_json = msgspec.json.Decoder(Submission, dec_hook=_dec_hook)
_event_json = msgspec.json.Decoder(Event, dec_hook=_dec_hook)
_submission_msgpack = msgspec.msgpack.Decoder(Submission, dec_hook=_dec_hook)
_event_msgpack = msgspec.msgpack.Decoder(Event, dec_hook=_dec_hook)
_events_msgpack = msgspec.msgpack.Decoder(list[Event], dec_hook=_dec_hook)
_raws_msgpack = msgspec.msgpack.Decoder(list[msgspec.Raw])

_UNKNOWN_TAG = re.compile(r"Invalid value (?P<value>.*) - at `\$\.(?P<field>op|msg)\.type`")
_TAG_NOUNS = {"op": "op type", "msg": "event type"}


def encode_json(obj: Any) -> bytes:
    """Compact JSON, keys in field order, as serde_json writes it."""
    return _json_encoder.encode(obj)


def encode_msgpack(obj: Any) -> bytes:
    return _msgpack_encoder.encode(obj)


def decode_submission_json(data: bytes | str) -> Submission:
    return _decode(_submission_json, data, "submission")


def decode_event_json(data: bytes | str) -> Event:
    return _decode(_event_json, data, "event")


def decode_submission_msgpack(data: bytes) -> Submission:
    return _decode(_submission_msgpack, data, "submission")


def decode_event_msgpack(data: bytes) -> Event:
    return _decode(_event_msgpack, data, "event")


def decode_events_msgpack(data) -> list[Event | ProtocolError]:
    """The events of an ``events`` body (:func:`broker.wire.frames.events_body`), in order:
    each an Event, or the ProtocolError of one that does not decode (the others still
    do). ProtocolError when the body is not an array of msgpack objects at all."""
    try:
        return frames.decode_with(_events_msgpack, data, "events")
    except frames.WireError:
        pass  # one of them is bad: each on its own
    out: list[Event | ProtocolError] = []
    for raw in _decode(_raws_msgpack, data, "events"):
        try:
            out.append(_decode(_event_msgpack, raw, "event"))
        except ProtocolError as err:
            out.append(err)
    return out


def _decode(decoder: Any, data: bytes | str, what: str) -> Any:
    try:
        return frames.decode_with(decoder, data, what)
    except frames.WireError as exc:
        reason = exc.reason
        unknown = _UNKNOWN_TAG.fullmatch(reason)
        if unknown:
            message = f"unknown {_TAG_NOUNS[unknown['field']]} {unknown['value']}"
        else:
            message = f"invalid {what}: {reason}"
        raise ProtocolError(message) from None
