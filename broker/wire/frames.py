"""The internal wire between the broker and its peers (frontends, executors, agent).

Every ZeroMQ message is multipart: ``[header, body...]`` from a DEALER peer, and
``[identity, header, body...]`` on the broker's ROUTER side. The header is a small
msgpack array (:class:`Header`) that the broker reads to route; the body is either a
msgpack-encoded Struct named by the header's kind, or, for output, the raw bytes of
one chunk, which nobody between the executor and the frontend decodes or copies.

Message kinds (``Header.kind``), who sends them, and their body:

========  ==========================  =====================================================
kind      direction                   body
========  ==========================  =====================================================
hello     peer -> broker              :class:`Hello` (role, auth token, pid, slots)
welcome   broker -> peer              :class:`Welcome`
error     broker -> peer              :class:`ErrorMsg` (``corr`` names the failed call)
run       frontend -> broker -> exec  :class:`RunRequest` (``corr`` = call id)
started   exec -> broker -> frontend  :class:`Started` (``corr`` = call id)
out       exec -> broker -> frontend  raw chunk bytes; ``stream`` is 1 (stdout) / 2 (stderr)
ack       frontend -> broker -> exec  none; ``n`` bytes, ``seq`` chunks consumed since the last ack
          exec -> broker -> frontend  none; ``n`` bytes of the call's stdin written to the command
in        frontend -> broker -> exec  the next bytes of the command's stdin (a run with ``stdin``,
                                      after ``started``); an empty frame is the end of file
resize    frontend -> broker -> exec  :class:`Winsize`: the new window size of a run with ``tty``
cancel    frontend -> broker -> exec  none (``corr`` = call id)
signal    frontend -> broker -> exec  none; ``n`` a signal for the command's process group, one of
                                      :data:`~landlock_helper.outcome.PASSABLE_SIGNALS` (``sluice run -i``'s
                                      Ctrl-C); an executor older than it ignores it
hold      broker -> exec              none; ``n`` 1: stop reading the call's output, 0: go on
exit      exec -> broker -> frontend  :class:`ExitStatus` (``corr`` = call id)
notice    broker -> frontend          :class:`ErrorMsg`: something the person should know
                                      about the call ``corr`` that does not end it (it
                                      waits for an executor being restarted, ...)
ping      either way                  none; answered with ``pong`` (liveness)
pong      either way                  none
bye       peer -> broker              none; the peer is leaving (executor drains first)
submit    frontend -> broker -> agent a Codex ``Submission`` (msgpack, :mod:`broker.wire.protocol`);
                                      ``session`` names it, "" with ``configure_session``
                                      creates one; ``corr`` is echoed in ``attached``
attached  broker -> frontend          :class:`SessionInfo`; ``session`` = the session the
                                      frontend is now attached to, ``corr`` = its submit's
                                      or attach's, ``seq`` and ``n`` as below
event     agent -> broker             a Codex ``Event`` (msgpack); ``session`` names it
          broker -> frontend          the same, outside the numbered stream (``seq`` 0): what
                                      the broker says about a session or a request
events    broker -> frontend          numbered events ``seq`` .. ``seq + n - 1`` of ``session``:
                                      a msgpack array (array 32) of their ``Event`` bodies,
                                      each as the agent sent it (:func:`events_body`)
closed    agent -> broker             none; the agent has let go of ``session`` (shut down)
serve     agent -> broker             none; the agent is ready to host sessions (sent once,
                                      after its welcome, when its handlers are in place)
attach    frontend -> broker          none; ``session`` to attach to, ``seq`` the first event
                                      wanted (0: all; :data:`SINCE_TURN`: the start of the
                                      current turn); answered with ``attached``
detach    frontend -> broker          none; stop sending ``session``'s events here
lagged    broker -> frontend          none; ``session``'s events stopped at ``seq`` because
                                      the frontend fell a window behind (or its queue was
                                      full); they resume, replayed from the log and
                                      journal, as it acks (or at the next heartbeat)
sessions  frontend -> broker          none; answered with ``sessions`` (same ``corr``),
          broker -> frontend          :class:`SessionList`
status    frontend -> broker          none; answered with ``status`` (same ``corr``),
          broker -> frontend          :class:`DaemonInfo` (``sluice daemon status``)
========  ==========================  =====================================================

``attached`` carries a :class:`SessionInfo` body; its header ``seq`` is the last event
*before* the first one this frontend will get (so the stream continues at ``seq + 1``,
gap-free), ``n`` the session's newest event at that moment. An ``attach`` past the newest
event starts at the next one; one asking for events no longer kept starts at the oldest
kept, and an unnumbered ``error`` event after ``attached`` says which are gone. Attaching
again re-positions the frontend: what it receives before the new ``attached`` belongs to
the old position. Should events a frontend has not been sent yet be dropped from the log
and journal while it lags, it gets the same kind of notice ("events N..M of this session
are no longer kept; continuing at M+1") and the stream goes on at M+1.

Session flow control: an ``ack`` with ``session`` set (``corr`` empty) says the frontend
has consumed ``session``'s events up to ``seq``, and ``n`` bytes of event bodies since
its previous session ack (the bodies of an ``events`` message are its body's bytes after
the first :data:`EVENTS_HEAD_SIZE`; a frontend that has consumed part of one may count
them in proportion). The broker keeps at most :data:`SESSION_WINDOW_EVENTS` events /
:data:`SESSION_WINDOW_BYTES` bytes unacknowledged per frontend and session; past that it
stops sending (``lagged``) and resumes from its log and journal as acks come, so a
frontend that stops reading never stalls the broker or the other frontends, and never
misses an event.

Flow control: an executor keeps at most :data:`WINDOW_BYTES` bytes / :data:`WINDOW_CHUNKS`
chunks of one call's output unacknowledged; the frontend acks what it has consumed, and the
executor stops reading that command's pipes while the window is full. So a slow frontend
slows only its own command (which blocks on a full pipe), nothing is dropped, and the
broker's memory per call is bounded.

A ``hold`` from the broker (header ``n`` 1) stops a call's output at once, whatever its
window: the executor stops reading the command's pipes until a ``hold`` with ``n`` 0. The
broker holds every call of a frontend that has fallen behind (its queue full, or more
than it may have unproven in flight), so a frontend with many chatty calls, or a stopped
one, costs the daemon a bounded amount and loses nothing.

The window binds while a command runs. Once a cancelled, timed-out or shut-down
command's tree is dead, the executor drains what is left in its pipes without waiting
for acks (at most one pipe's capacity per stream), so its ``exit`` can always be sent.

Terminals and long-lived commands: a run with ``tty`` (a :class:`Winsize`) gets a new
pty, made by the executor outside the sandbox, as its stdin, stdout and stderr and as
its session's controlling terminal (so Ctrl-C written to it signals the command's
foreground job); all its output comes as ``out`` on stream 1, its stdin (with ``stdin``)
goes to the pty, and ``resize`` changes its window (the command gets SIGWINCH). A run
marked ``interactive`` is one that waits for input (a shell, a REPL, a dev server): it
does not take one of an executor's slots, so such commands left running never hold up
others; an executor hosts at most :data:`INTERACTIVE_PER_EXECUTOR` of them, and one
that none can host is refused.

A run's ``cwd`` is where the command runs; its ``sandbox_cwd`` (default: ``cwd``) is the
directory the policy's ``disk-write-cwd`` means. Its ``limits``
(:class:`landlock_helper.limits.Limits`) are the command's resource limits, each field
None for the executor's default and 0 for none; the ``exit``'s ``limit`` names the one
the command ran into ("killed: memory limit 512 MiB reached"). A run that is refused or cannot start
(bad body or policy, missing cwd, relative ``sandbox_cwd``, no sandbox, executor
shutting down) gets only an ``exit`` with ``error`` set, never a ``started``.
A command that was not found gets ``exit_code`` 127 *and* ``error``. ``Started.pid`` is
the pid of the command's sandbox supervisor, not of the command itself. Any message
from the broker counts as a sign of life for an executor, not only ``ping``.

Frame counts are strict: ``hello``, ``run``, ``started``, ``out``, ``in``, ``resize``,
``exit``, ``submit`` and ``event`` carry exactly one body frame, and so do the broker's ``attached``, its
``events`` and its ``sessions`` and ``status`` answers; every other kind carries none. A frontend must answer
``ping`` with ``pong``; one that misses five while it has calls in flight is presumed gone
and its calls are cancelled.

Malformed messages (a header or body that does not decode, in any way: truncated, wrong
types, strings that are not UTF-8, nesting deeper than the stack; a wrong frame count; a
kind the sender may not send) never fail the receiver: every decoder failure is a
:class:`WireError` (:func:`decode_with`). The broker answers one with an ``error`` carrying
its ``corr`` when its header could be read (a malformed ``submit`` or ``attach`` gets the
unnumbered ``error`` event those get), and a peer that has not said hello gets one too;
what cannot be answered is dropped with a rate-limited log line.

Call ids are chosen by the frontend (uuid4 hex) and must be unique among calls in flight;
the broker refuses a duplicate with an ``error``.

Sessions: the broker hosts them in the one agent process it spawns (the agent peer whose
hello pid is that process's, once it said ``serve``; other agent-role peers may only
``run``). A ``submit`` with
an empty ``session`` must carry ``configure_session``: the broker names a new session
(uuid4), attaches the frontend, answers ``attached`` and forwards the submission to the
agent with ``session`` set; the agent's session takes that id. Every ``event`` of a
session goes to every frontend attached to it, numbered with ``seq`` counting 1, 2, 3,
... per session, its body untouched, in an ``events`` message: the events that are ready
to go to a frontend at once (those the agent sent during one turn of the broker's loop,
or a run of them replayed from the log or journal) go in one message, its body built
once and the same frame sent to every frontend at that position. Submitting to a session attaches the frontend to it
(at its newest event, unless it is attached already).
Submissions are forwarded in the order they come and never queued behind other work;
when the agent is not running yet they wait (bounded) for it to say hello. What the broker
itself has to say about a session (unknown session, no agent, the agent died) comes as an
``event`` with an ``error`` message, ``seq`` 0 when the session does not exist or when
it concerns one frontend only (events no longer kept, an approval answered already).

Approvals: the first ``exec_approval`` / ``patch_approval`` answering a pending request
(its ``id`` being the request's event id or ``call_id``) is forwarded, and the broker
publishes a numbered ``approval_resolved`` event (the request's id; ``call_id``,
``decision``, ``by`` = the answering frontend's name) to every attached frontend. A later
answer to that request is not forwarded; only its sender gets an unnumbered ``error``
naming who answered first. An answer matching no request is forwarded as it is.

Typing: an ``exec_command_stdin`` is forwarded only from a frontend attached to the
session (else only its sender gets an unnumbered ``error``), with its ``by`` set to that
frontend's name, which the agent's ``exec_command_stdin_typed`` event then carries.
"""

from __future__ import annotations

import struct
from typing import Literal

import msgspec

from broker.wire import run_args
from broker.wire.results import shell_returncode
from landlock_helper.limits import Limits
from landlock_helper.policy import DiskWriteFolder, SandboxPolicy

# 2: RunRequest.sandbox_cwd. An executor of version 1 would ignore it and make the
# command's own directory (a model's workdir) writable, so versions must match.
# 3: numbered session events come in ``events`` batches, which a frontend of version 2
# would drop.
# 4: ``hold``, which an executor of version 3 would ignore, letting a stopped frontend's
# calls fill the daemon.
PROTOCOL_VERSION = 4

HELLO = "hello"
WELCOME = "welcome"
ERROR = "error"
RUN = "run"
STARTED = "started"
OUT = "out"
ACK = "ack"
CANCEL = "cancel"
EXIT = "exit"
PING = "ping"
PONG = "pong"
BYE = "bye"
SUBMIT = "submit"
ATTACHED = "attached"
EVENT = "event"
EVENTS = "events"
CLOSED = "closed"
SERVE = "serve"
ATTACH = "attach"
DETACH = "detach"
LAGGED = "lagged"
SESSIONS = "sessions"
NOTICE = "notice"
IN = "in"
RESIZE = "resize"
SIGNAL = "signal"
STATUS = "status"
HOLD = "hold"

# ``attach`` header seq: start at the current (or, when idle, the last) turn's task_started.
SINCE_TURN = -1

STDOUT = 1
STDERR = 2

ROLE_FRONTEND = "frontend"
ROLE_EXECUTOR = "executor"
ROLE_AGENT = "agent"
ROLES = (ROLE_FRONTEND, ROLE_EXECUTOR, ROLE_AGENT)

WINDOW_BYTES = 8 * 1024 * 1024
WINDOW_CHUNKS = 4096
# A frontend keeps at most this much of a command's stdin unacknowledged (in flight or
# waiting in the executor for the command to read it).
STDIN_WINDOW_BYTES = 1024 * 1024
# An executor acks stdin once this much more has gone into the command's pipe.
STDIN_ACK_EVERY_BYTES = 64 * 1024
# A frontend acks once it has consumed this much of a call (bytes or chunks).
ACK_EVERY_BYTES = 1024 * 1024
ACK_EVERY_CHUNKS = 256

# Session events in flight to one frontend, unacknowledged, at most (see ``lagged``).
SESSION_WINDOW_EVENTS = 4096
SESSION_WINDOW_BYTES = 8 * 1024 * 1024
# A frontend acks a session's events once it has consumed this many / this many bytes.
SESSION_ACK_EVERY_EVENTS = 256
SESSION_ACK_EVERY_BYTES = 1024 * 1024

# Interactive runs (``RunRequest.interactive``) one executor hosts at most, beyond its slots.
INTERACTIVE_PER_EXECUTOR = 256

# Defined with the checks of a run's arguments: what a run captures by default, and the
# largest message the broker accepts from any peer (ZMQ_MAXMSGSIZE).
DEFAULT_CAPTURE_LIMIT = run_args.DEFAULT_CAPTURE_LIMIT
MAX_MESSAGE_SIZE = run_args.MAX_MESSAGE_SIZE


class Header(msgspec.Struct, array_like=True, frozen=True):
    kind: str
    corr: str = ""
    session: str = ""
    seq: int = 0
    stream: int = 0
    n: int = 0


class Hello(msgspec.Struct, frozen=True):
    role: str
    token: str
    pid: int = 0
    name: str = ""
    # How many commands an executor runs at once.
    slots: int = 0
    version: int = PROTOCOL_VERSION
    # sluice's release (broker.wire.version); "" from a peer older than this field.
    # New fields go last with a default: a peer that lacks them decodes the rest.
    sluice_version: str = ""


class Welcome(msgspec.Struct, frozen=True):
    peer_id: str
    version: int = PROTOCOL_VERSION
    # Seconds between broker pings; a peer that misses several is presumed dead.
    heartbeat_s: float = 1.0
    # The daemon's sluice release; "" from a daemon older than this field.
    sluice_version: str = ""


class ErrorMsg(msgspec.Struct, frozen=True):
    message: str


class Winsize(msgspec.Struct, frozen=True):
    """A terminal's size in characters."""

    rows: int
    cols: int

    def __post_init__(self) -> None:
        if not (0 < self.rows < 65536 and 0 < self.cols < 65536):
            raise msgspec.ValidationError(f"window size {self.rows}x{self.cols} out of range (1..65535)")


class RunRequest(msgspec.Struct, frozen=True):
    argv: list[str]
    # Where the command runs.
    cwd: str
    sandbox: SandboxPolicy
    # The command's environment, already without secrets: the sender filters it
    # (landlock_helper.env) before it leaves its process, and the executor filters it again
    # (except the names in env_passthrough). None: the executor's own environment, filtered.
    env: dict[str, str] | None = None
    env_passthrough: list[str] = []
    timeout_ms: int | None = None
    capture_limit: int = DEFAULT_CAPTURE_LIMIT
    # Directories shown read-only at their own path (absolute): those in the host's /tmp,
    # which the sandbox's own /tmp otherwise covers (landlock_helper.mounts).
    readable: list[str] = []
    # The directory the policy's ``disk-write-cwd`` makes writable (absolute); None: ``cwd``.
    # The agent sets it to the session's cwd, so a model-chosen workdir is only where
    # the command runs, never a writable root.
    sandbox_cwd: str | None = None
    # Resource limits (landlock_helper.limits): a field left None takes the executor's
    # default, 0 means no limit. None: the defaults, every one.
    limits: Limits | None = None
    # The caller sends the command's stdin (``in`` messages, acked by the executor);
    # False: the command's stdin is /dev/null.
    stdin: bool = False
    # A pty of this size is the command's terminal (stdin, stdout and stderr).
    tty: Winsize | None = None
    # Waits for input, maybe for long: takes no slot (see "Terminals" above).
    interactive: bool = False
    # The command's stdio are the caller's own file descriptors, which the daemon hands
    # the executor over its fd channel (a direct run, :mod:`broker.wire.direct`): the
    # command writes to them itself, so no ``out`` comes and nothing is captured; ``stdin``
    # then says whether a third fd is its stdin. Only a local caller of the daemon's
    # run.sock can ask for it.
    stdio_fds: bool = False
    # A batch for sluice's own file operations (landlock_helper.fileops, JSON): the run
    # is that builtin, in the sandbox of ``sandbox``, instead of ``argv`` (which only
    # names it); the executor writes the batch to its stdin, its answer is its stdout.
    # Empty, with ``stdin``: the caller writes the batches, one answer at a time.
    # How the agent reads and writes files for the model: never with its own rights.
    fileops: bytes | None = None
    # Of a direct run's stdout and stderr, those the caller sends no fd for: the command
    # gets the sandbox's own /dev/null there (the caller's is /dev/null: nothing to relay).
    stdio_null: list[Literal["stdout", "stderr"]] = []


class Started(msgspec.Struct, frozen=True):
    pid: int
    executor: str = ""


class ExitStatus(msgspec.Struct, frozen=True):
    """How a command ended: the one outcome type of sluice. The executor sends it, the
    client's :class:`broker.client.Result` and the agent's ``ExecResult`` are it with the
    call's identity or the interleaved output added. Exactly one of exit_code / signal is
    set unless ``error`` is."""

    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    aborted: bool = False
    duration_s: float = 0.0
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    # Set when the command never ran or its executor failed; a person can read it.
    error: str | None = None
    # The resource limit the command ran into, for a person: "killed: memory limit 512 MiB
    # reached", "pids limit 256 reached (12 forks refused)". None: none was hit (or seen).
    limit: str | None = None

    @property
    def returncode(self) -> int:
        """One number, shell style: see :func:`broker.wire.results.shell_returncode`."""
        return shell_returncode(self)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


# Session states, as ``SessionInfo.state`` spells them.
STATE_IDLE = "idle"
STATE_RUNNING = "running"
STATE_WAITING = "waiting_for_approval"


class SessionInfo(msgspec.Struct, frozen=True):
    """One session as ``sluice sessions`` lists it (and ``attached`` describes it)."""

    id: str
    cwd: str = ""
    model: str = ""
    state: str = STATE_IDLE
    # Names of the attached frontends (``frontend-7 (sluice attach)``).
    frontends: list[str] = []
    # Unix time the session was created.
    created: float = 0.0
    # The newest event's seq; the seq of the current (or last) turn's task_started, 0 if none.
    seq: int = 0
    turn_start: int = 0
    # call_ids of approval requests nobody has answered yet.
    pending_approvals: list[str] = []


class SessionList(msgspec.Struct, frozen=True):
    sessions: list[SessionInfo] = []
    # Frontends connected to the daemon, attached or not.
    frontends: int = 0
    executors: int = 0


class ExecutorInfo(msgspec.Struct, frozen=True):
    """One executor as ``sluice daemon status`` shows it."""

    name: str
    pid: int = 0
    # Connected over tcp (another host), not spawned by the daemon.
    remote: bool = False
    slots: int = 0
    busy: int = 0
    interactive: int = 0


class DaemonInfo(msgspec.Struct, frozen=True):
    """What the daemon says about itself (the ``status`` answer)."""

    sluice_version: str = ""
    protocol: int = PROTOCOL_VERSION
    pid: int = 0
    # Seconds since it started serving.
    uptime_s: float = 0.0
    socket: str = ""
    # The tcp endpoint it listens on ("" when it does not).
    listen: str = ""
    log: str = ""
    runtime_dir: str = ""
    executors: list[ExecutorInfo] = []
    # Executors it spawns (configured), and those being restarted right now.
    executors_wanted: int = 0
    queued: int = 0
    frontends: int = 0
    sessions: int = 0
    max_sessions: int = 0
    # The session journal: bytes on disk (None: journaling is off).
    journal_bytes: int | None = None
    agent_running: bool = False


def dec_hook(type_: type, obj):
    """msgspec's hook for the sandbox policy's folder permission (a dict of the sandbox's,
    which imports no msgspec): the one type on the wire that is not msgspec's own."""
    if type_ is DiskWriteFolder:
        return DiskWriteFolder.from_json(obj)
    raise NotImplementedError(f"cannot decode {type_.__name__}")


_header_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(Header)
_encoder = msgspec.msgpack.Encoder()
_decoders = {
    HELLO: msgspec.msgpack.Decoder(Hello),
    WELCOME: msgspec.msgpack.Decoder(Welcome),
    ERROR: msgspec.msgpack.Decoder(ErrorMsg),
    NOTICE: msgspec.msgpack.Decoder(ErrorMsg),
    RUN: msgspec.msgpack.Decoder(RunRequest, dec_hook=dec_hook),
    STARTED: msgspec.msgpack.Decoder(Started),
    EXIT: msgspec.msgpack.Decoder(ExitStatus),
    ATTACHED: msgspec.msgpack.Decoder(SessionInfo),
    SESSIONS: msgspec.msgpack.Decoder(SessionList),
    STATUS: msgspec.msgpack.Decoder(DaemonInfo),
    RESIZE: msgspec.msgpack.Decoder(Winsize),
}


def run_from_builtins(fields: dict) -> RunRequest:
    """A direct run's request (:mod:`broker.wire.direct`, JSON values) as a
    :class:`RunRequest`, checked as a wire message is; raises :class:`WireError`."""
    try:
        return msgspec.convert(fields, RunRequest, dec_hook=dec_hook)
    except (msgspec.ValidationError, ValueError, TypeError) as e:
        raise WireError(f"bad run request: {one_line(e)}") from None


def exit_builtins(status: ExitStatus) -> dict:
    """An exit as a direct run's caller gets it: JSON values, without captured output."""
    out = msgspec.to_builtins(status)
    out.pop("stdout", None)
    out.pop("stderr", None)
    return out


def one_line(text: object, limit: int = 500) -> str:
    """A message for a person, as the wire carries it: one line (runs of whitespace,
    newlines included, become one space), cut with an ellipsis past ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class WireError(ValueError):
    """A frame that does not decode; never fatal for the receiver. ``reason``: what was
    wrong with it, without saying which frame."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def decode_with(decoder, data, what: str):
    """``decoder.decode(data)``, or :class:`WireError` ("bad {what}: why"): the one place
    where bytes from another process (or a person) are decoded, so that nothing a decoder
    can raise gets past the receiver. Besides msgspec's DecodeError and ValidationError
    that is UnicodeDecodeError (a string that is not UTF-8), RecursionError (nesting
    deeper than the stack), MemoryError, and whatever a dec_hook raises."""
    try:
        return decoder.decode(data)
    except Exception as e:  # every way bytes can fail to decode is a bad frame
        reason = _decode_failure(e)
        raise WireError(f"bad {what}: {reason}", reason) from None


def _decode_failure(e: Exception) -> str:
    if isinstance(e, msgspec.MsgspecError):
        return one_line(e)
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, UnicodeDecodeError):
        return "a string is not valid UTF-8"
    if isinstance(e, MemoryError):
        return "too large to decode"
    return one_line(f"{type(e).__name__}: {e}")


_EVENTS_HEAD = struct.Struct(">BI")
# The bytes of an ``events`` body before the events' own: a msgpack array 32 header.
EVENTS_HEAD_SIZE = _EVENTS_HEAD.size


def events_body(count: int, parts) -> bytes:
    """The body of an ``events`` message: a msgpack array of ``count`` events whose bodies
    (each one msgpack object) ``parts`` holds back to back, in one or more buffers."""
    return b"".join([_EVENTS_HEAD.pack(0xDD, count), *parts])


def header(kind: str, corr: str = "", *, session: str = "", seq: int = 0, stream: int = 0, n: int = 0) -> bytes:
    return _header_encoder.encode(Header(kind, corr, session, seq, stream, n))


def encode(body: msgspec.Struct) -> bytes:
    return _encoder.encode(body)


def decode_header(frame) -> Header:
    return decode_with(_header_decoder, frame, "header")


def decode(kind: str, frame):
    """Decode the body of a message of ``kind``; raises :class:`WireError`."""
    dec = _decoders.get(kind)
    if dec is None:
        raise WireError(f"kind {kind!r} has no body")
    return decode_with(dec, frame, f"{kind} body")


def message(kind: str, corr: str = "", body: msgspec.Struct | None = None, **fields) -> list[bytes]:
    """A ready-to-send ``[header, body?]`` list."""
    parts = [header(kind, corr, **fields)]
    if body is not None:
        parts.append(encode(body))
    return parts
