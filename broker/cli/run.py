"""``sluice run``: one command through the daemon, its output streamed as it comes
(raw bytes, or Codex-shaped events with ``--json``), its exit code ours. On a terminal,
the sequences that set the clipboard or the title or make the terminal answer are
dropped (:mod:`broker.cli.terminal_guard`; ``--raw-escapes`` keeps them); pipes and
files get every byte. Its stdin is
ours when that is a pipe or a file (or, with ``-i``, a terminal); with ``-t`` it gets a
terminal of its own in the sandbox, to which our raw terminal's keys and window size go
(:mod:`broker.cli.terminal`)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import sys
from typing import Protocol

from broker.cli.base import (
    USAGE_RUN,
    CliExit,
    ConfigError,
    announce,
    command_of,
    env_report,
    fail,
    host_tmp_check,
    print_error,
    read_config,
    read_stdin,
    remote_from_args,
    run_roots,
    widen_pipe,
)
from broker.cli.home_writes import HomeWrites
from broker.cli.outlet import Outlet
from broker.cli.run_direct import DirectRun, NotRun
from broker.cli.terminal import (
    NOT_A_TERMINAL,
    CtrlC,
    EscapeKeys,
    RawTerminal,
    escape_char,
    is_terminal,
    window_size,
)
from broker.cli.terminal_guard import output_guards, relay_filter
from broker.wire.results import EXIT_NOT_FOUND, EXIT_SIGNAL_BASE, EXIT_SLUICE, EXIT_USAGE, new_call_id
from broker.wire.run_args import RunArgsError, check_run

# How long ``sluice run`` waits for a cancelled call to end before giving up.
CANCEL_WAIT_S = 5.0


def _notice(call, note: str) -> None:
    print(f"sluice: {note}", file=sys.stderr, flush=True)


def run_main(args) -> int:
    command = command_of(args, USAGE_RUN)
    if args.tty and not is_terminal(0):
        return fail(NOT_A_TERMINAL, EXIT_USAGE)
    if args.tty and args.json:
        return fail("-t and --json do not go together (a terminal's output is not events)", EXIT_USAGE)
    try:
        args.escape = escape_char(args.escape)
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)

    stdin = args.tty or _forwarded_stdin(args.interactive) is not None
    try:
        writable, readable = run_roots(args, local=not args.connect)
    except ConfigError as e:
        return fail(str(e), EXIT_USAGE)
    try:
        fields = check_run(
            command,
            cwd=args.cwd,
            sandbox=args.sandbox,
            writable=writable,
            readable=readable,
            network=args.network,
            env_passthrough=args.env,
            timeout_ms=args.timeout_ms,
            check_paths=not (args.connect or args.ray),
            memory=args.memory,
            pids_limit=args.pids_limit,
            file_size=args.file_size,
            cpu_time=args.cpu_time,
            limits=config_limits(),
            stdin=stdin,
            interactive=args.tty or args.interactive,
        )
    except RunArgsError as e:
        return fail(str(e), EXIT_USAGE)
    if not args.connect:  # another host's /tmp is not ours to look at
        code = host_tmp_check(command, fields["cwd"], fields["env"], fields["sandbox"], fields["readable"])
        if code is not None:
            return code
    if args.env_report:
        env_report(args.env)
    try:
        guards = output_guards(args.raw_escapes)
    except ConfigError as e:
        return fail(str(e), EXIT_USAGE)
    # What a person reads on a terminal: a write refused under the home directory gets a hint.
    policy = fields["sandbox"]
    watch = HomeWrites(writable=policy.writable_roots(fields["cwd"], fields["env"])) \
        if is_terminal(2) and not (args.tty or args.json or policy.full_write) else None

    remote = remote_from_args(args)
    transport = DirectRun(fields, screen=relay_filter(guards), watch=watch) if DirectRun.serves(args, remote) \
        else BrokerRun(fields, args, guards, watch, remote)
    try:
        try:
            result = transport.run(CANCEL_WAIT_S)
        except NotRun:
            if transport.signum is not None:  # nothing ran, and we were told to stop meanwhile
                return EXIT_SIGNAL_BASE + transport.signum
            transport = BrokerRun(fields, args, guards, watch, remote)
            result = transport.run(CANCEL_WAIT_S)
    except TimeoutError:
        print_error(f"the command did not end within {CANCEL_WAIT_S:g} s of being cancelled; exiting anyway")
        return EXIT_SIGNAL_BASE + transport.signum if transport.signum else EXIT_SLUICE
    return _ending(result, command, args, transport.signum, transport.stdout_closed, watch)


class Transport(Protocol):
    """How ``sluice run`` has its command run: handed to the local daemon over run.sock
    (:class:`~broker.cli.run_direct.DirectRun`, which relays our stdio itself) or sent
    through the broker socket (:class:`BrokerRun`, the client library's messages)."""

    # The signal that told us to stop the command, if one did.
    signum: int | None
    # Our stdout was closed under us: we stopped the command as a closed pipe would.
    stdout_closed: bool

    def run(self, cancel_wait_s: float):
        """The command's end (:class:`~broker.wire.frames.ExitStatus`'s fields and
        ``returncode``). Our stopping signals cancel it, and its end is waited for up to
        ``cancel_wait_s`` (then TimeoutError). Raises
        :class:`~broker.cli.run_direct.NotRun` when this transport cannot run it and
        nothing ran, and :class:`~broker.cli.base.CliExit` when it failed (said)."""


class BrokerRun:
    """The broker socket and the client library (a :class:`Transport`): the command's
    output comes as messages (or Codex-shaped events with ``--json``); a terminal of its
    own with ``-t``."""

    def __init__(self, fields: dict, args, guards: dict, watch: HomeWrites | None, remote) -> None:
        self.fields = fields
        self.args = args
        self.guards = guards
        self.watch = watch
        self.remote = remote
        self.signum: int | None = None
        self.stdout_closed = False

    def run(self, cancel_wait_s: float):
        import broker.client as C
        from broker.client.requests import winsize
        from broker.wire import frames as wire

        args = self.args
        try:
            request = wire.RunRequest(**self.fields, tty=winsize(*window_size(0, 1, 2)) if args.tty else None)
        except C.UsageError as e:
            raise CliExit(fail(str(e), EXIT_USAGE)) from None
        out = _JsonOutput(request) if args.json else _RawOutput(self.guards, self.watch)
        try:
            client = C.Client.connect(remote=self.remote, name="sluice run")
        except C.DaemonError as e:
            out.error(str(e))
            raise CliExit(fail(str(e), EXIT_SLUICE)) from None
        announce(client)

        with client, client.catch_signals():
            call = client.submit_request(request, call_id=out.call_id, on_output=out.on_output)
            call.on_notice = _notice
            out.begin(client, call)
            try:
                # Raw mode ends with this block, whatever ends it, before anything is said below.
                with RawTerminal(0) if args.tty else contextlib.nullcontext() as term:
                    if term is not None:
                        call.on_notice = lambda call, note: term.say(note)
                    try:
                        if term is not None:
                            _feed(client, call, term.fd, out, term, EscapeKeys(args.escape))
                        # (With -t, Ctrl-C is a key for the command's terminal, not our signal.)
                        passing = args.interactive and term is None
                        result = _follow(client, call, out, request.stdin and term is None,
                                         CtrlC() if passing else None)
                    except C.Interrupted as e:
                        self.signum = e.signum
                        client.cancel(call)
                        # Further signals are noted but do not cut the wait short: the tree must die
                        # first. What our reader has not taken of its output is dropped.
                        out.drop(lossy=True)
                        result = client.wait(call, cancel_wait_s, interruptible=False)
            except C.DaemonError as e:
                out.error(str(e))
                out.finish()
                raise CliExit(fail(str(e), EXIT_SLUICE)) from None

        out.end(result)
        out.finish()
        self.stdout_closed = out.stdout_closed
        return result


def _follow(client, call, out: _Output, stdin: bool, ctrl_c: CtrlC | None):
    """Our stdin to the call (when it has one) while its output goes on, then its result.
    With ``ctrl_c`` (``-i``), SIGINT is passed to the command rather than ending the wait."""
    import broker.client as C

    fed = not stdin
    while True:
        try:
            if not fed:
                _feed(client, call, 0, out)
                fed = True
            return out.wait(client, call)
        except C.Interrupted as e:
            if ctrl_c is None or e.signum != signal.SIGINT or not ctrl_c.passes(call.started):
                raise
            client.signal_command(call, signal.SIGINT)


def _ending(result, command: list[str], args, signum: int | None, stdout_closed: bool,
            watch: HomeWrites | None = None) -> int:
    """Our exit code for the command's ``result`` (anything with ExitStatus's fields and
    ``returncode``), and the line a person should read about how it ended (or about a
    write it was refused under the home directory, ``watch``)."""
    if result.limit:
        print_error(result.limit)
    elif signum is None and not args.json and is_terminal(2):
        ending = describe_ending(result, args.timeout_ms)
        if ending:
            print_error(ending)
        elif watch is not None and result.error is None and result.returncode != 0:
            hint = watch.hint()
            if hint:
                print_error(hint)
    if signum is not None:
        return EXIT_SIGNAL_BASE + signum
    if stdout_closed:
        return EXIT_SIGNAL_BASE + signal.SIGPIPE
    if result.error is not None:
        code = result.returncode
        if code == EXIT_NOT_FOUND:
            print_error(f"command not found: {command[0]}")
        else:
            print_error(f"error: {result.error}")
        return code
    return result.returncode


def describe_ending(result, timeout_ms: int | None) -> str | None:
    """One line for a person on a command that timed out or was killed by a signal (said
    on a terminal only: the exit code alone, 124 or 128+N, is easy to miss there)."""
    if result.error is not None or result.aborted:
        return None
    if result.timed_out:
        after = f" after {timeout_ms} ms" if timeout_ms else ""
        return f"timed out{after} (--timeout-ms): the command and its processes were killed (exit 124)"
    if result.signal is not None and result.signal != signal.SIGPIPE:
        # (SIGPIPE: our reader left, as in `sluice run -- yes | head -1`; a shell says nothing either.)
        try:
            name = signal.Signals(result.signal).name
        except ValueError:
            name = f"signal {result.signal}"
        return f"the command was killed by {name} (signal {result.signal}, exit {EXIT_SIGNAL_BASE + result.signal})"
    return None


# How much of our stdin one read takes (a pipe holds 64 KiB; a file gives what is asked).
STDIN_READ = 256 * 1024


def _forwarded_stdin(interactive: bool = False) -> int | None:
    """Our stdin when the command gets it: a pipe, a file or a socket, and a terminal with
    ``-i`` (``interactive``: lines as the terminal hands them over, end of file at
    Ctrl-D). Otherwise a terminal is not forwarded (the command's stdin is /dev/null, as
    without a terminal of its own), nor is /dev/null, nor a stdin that is closed."""
    try:
        st = os.fstat(0)
    except OSError:
        return None
    if os.isatty(0):
        return 0 if interactive else None
    if stat.S_ISCHR(st.st_mode):
        return None  # /dev/null, or another device: nothing a command should read through us
    return 0


def _feed(client, call, fd: int, out: _Output, term: RawTerminal | None = None,
          escapes: EscapeKeys | None = None) -> None:
    """Our input to ``call`` until its end or the call's, at most what the executor's acks
    leave room for (a 1 GiB stdin is read as the command reads it, not into anyone's
    memory; keys wait in our terminal), its output going on meanwhile (``out``).

    ``fd`` is our stdin, whose end is the command's end of file; or, with ``term``
    (``-t``), our raw terminal, whose keys go to the command's pty as bytes along with
    our window's changes, and whose ``~.`` (``escapes``) ends the command as a hang-up of
    its terminal would: raises :class:`broker.client.Interrupted` for SIGHUP."""
    import broker.client as C

    if term is None:
        # A writer ahead of us then leaves reads of up to STDIN_READ, not 64 KiB, so a big stdin
        # goes in a quarter of the messages, each of which costs the daemon and the executor.
        widen_pipe(fd)
    reading = True
    while not call.done:
        if term is not None and term.resized():
            client.resize(call, *term.size())
        room = client.stdin_room(call) if reading else 0  # room: the start, or acks
        # SIGWINCH wakes this wait too (Python's wakeup fd is in the client's poller).
        ready = client.wait_io((fd,) if room else (), None, writable=out.waiting())
        out.flush()
        if fd not in ready:
            continue
        try:
            data = read_stdin(fd, min(room, STDIN_READ), terminal=term is not None)
        except BlockingIOError:
            continue
        if not data and term is None:
            client.close_stdin(call)
            return
        # Our terminal hung up (SIGHUP follows): nothing more to type; the command's pty
        # stays open until it exits or is cancelled.
        reading = bool(data)
        asked = None
        if escapes is not None:
            data, asked = escapes.feed(data)
        if data:
            client.write_stdin(call, data)
        if asked == EscapeKeys.HELP:
            term.say(escapes.help())
        elif asked == EscapeKeys.END:
            term.say(escapes.ending())
            raise C.Interrupted(signal.SIGHUP)


def config_limits():
    """The ``[limits]`` table of ``$SLUICE_HOME/config.toml`` (None without one); the
    flags override it. Raises :class:`~broker.wire.run_args.RunArgsError` when it is wrong."""
    try:
        path, table = read_config(b"limits")
    except ConfigError as e:
        raise RunArgsError(str(e)) from None
    if "limits" not in table:
        return None
    from landlock_helper.limits import LimitError, from_table

    try:
        return from_table(table["limits"], f"{path}: [limits]")
    except LimitError as e:
        raise RunArgsError(str(e)) from None


class _Output:
    """The command's output on our stdout and stderr (:class:`~broker.cli.outlet.Outlet`):
    what a full pipe does not take yet waits here, the call's output held back meanwhile,
    so waiting for the call goes on (its exit, its timeout, our signals) whatever our
    reader does."""

    call_id = None

    def __init__(self) -> None:
        stdout = Outlet(1)
        # One pipe for both (2>&1): one outlet, so what waits keeps the order it came in.
        self.outlets = {1: stdout, 2: stdout if _same_file(1, 2) else Outlet(2)}
        self.stdout_closed = False
        self.lossy = False
        self._client = None
        self._call = None

    def begin(self, client, call) -> None:
        self._client = client
        self._call = call

    def waiting(self) -> tuple[int, ...]:
        """The descriptors to wait on until they take more (for :meth:`Client.wait_io`)."""
        return tuple(fd for fd in (o.waiting for o in self.outlets.values()) if fd >= 0)

    def put(self, fd: int, data) -> None:
        outlet = self.outlets[fd]
        if outlet.closed:
            return
        try:
            outlet.write(data)
        except OSError as e:
            self._failed(outlet, e)
        if outlet.pending and self.lossy:
            outlet.pending.clear()
        elif outlet.pending and self._call is not None:
            self._client.hold_output(self._call)

    def flush(self) -> None:
        """Write what our descriptors take now of what waits for them."""
        for outlet in self.outlets.values():
            try:
                outlet.flush()
            except OSError as e:
                self._failed(outlet, e)
        if not self.waiting() and self._call is not None:
            self._client.release_output(self._call)

    def wait(self, client, call):
        """Pump until ``call`` ends, writing its output as our descriptors take it; then
        the rest, unless it timed out: its deadline is ours too, and what our reader has
        not taken by then is dropped. Raises like :meth:`Client.wait`."""
        while not call.done:
            client.wait_io((), None, writable=self.waiting())
            self.flush()
        result = client.wait(call)
        if result.timed_out:
            self.drop()
        while self.waiting():
            client.wait_io((), None, writable=self.waiting())
            self.flush()
        return result

    def drop(self, *, lossy: bool = False) -> None:
        """Drop what waits for our descriptors; the call's output flows again. ``lossy``:
        from now on, what they do not take at once is dropped too (we were interrupted:
        nothing may keep us waiting for our reader)."""
        self.lossy = self.lossy or lossy
        for outlet in self.outlets.values():
            outlet.pending.clear()
        if self._call is not None:
            self._client.release_output(self._call)

    def finish(self) -> None:
        """Write what still waits (whatever the client's state), then stop writing."""
        for outlet in self.outlets.values():
            try:
                outlet.finish()
            except OSError as e:
                self._failed(outlet, e)
            outlet.close()

    def _failed(self, outlet: Outlet, e: OSError) -> None:
        outlet.close()
        if outlet.fd != 1:
            return  # our stderr is gone: nothing to tell anyone
        # A closed pipe, or a terminal hung up (EIO): like a command writing into a closed
        # pipe, stop it. Anything else (a full disk) is said, not swallowed.
        if not isinstance(e, BrokenPipeError) and e.errno != errno.EIO:
            raise e
        self.stdout_closed = True
        call = self._call
        if call is not None and not call.done:
            self._client.cancel(call)
            if not self.waiting():
                self._client.release_output(call)

    def error(self, message: str) -> None:
        pass

    def end(self, result) -> None:
        pass


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class _RawOutput(_Output):
    """Bytes of the command's stdout/stderr to ours, as they come (through ``guards``, by
    our fd, for a terminal: :mod:`broker.cli.terminal_guard`)."""

    def __init__(self, guards: dict, watch: HomeWrites | None = None) -> None:
        super().__init__()
        self._guards = guards
        self._watch = watch

    def on_output(self, call, stream, chunk) -> None:
        if self._watch is not None:
            self._watch.feed(chunk, stream)
        fd = 2 if stream == 2 else 1
        guard = self._guards.get(fd)
        self.put(fd, guard.feed(chunk) if guard is not None else chunk)

    def finish(self) -> None:
        for fd, guard in self._guards.items():
            self.put(fd, guard.flush())  # an unfinished sequence is dropped
        super().finish()


class _JsonOutput(_Output):
    """Codex-shaped events, one JSON object per line on stdout."""

    def __init__(self, request) -> None:
        super().__init__()
        # Here, not at the top: the Codex types cost a plain `sluice run` a tenth of its start-up.
        from broker.wire import protocol

        self.P = protocol
        self.request = request
        self.call_id = new_call_id()
        self._names = {1: "stdout", 2: "stderr"}

    def _emit(self, msg) -> None:
        self.put(1, self.P.encode_json(self.P.Event(id=self.call_id, msg=msg)) + b"\n")

    def begin(self, client, call) -> None:
        super().begin(client, call)
        self._emit(self.P.ExecCommandBeginEvent(call_id=self.call_id, command=list(self.request.argv), cwd=self.request.cwd))

    def on_output(self, call, stream, chunk) -> None:
        self._emit(self.P.ExecCommandOutputDeltaEvent(call_id=self.call_id, stream=self._names.get(stream, "stdout"), chunk=bytes(chunk)))

    def error(self, message: str) -> None:
        self._emit(self.P.ErrorEvent(message=message))

    def end(self, result) -> None:
        if result.error is not None:
            self.error(result.error)
        stdout = result.stdout.decode("utf-8", "replace")
        stderr = result.stderr.decode("utf-8", "replace")
        aggregated = stdout + stderr
        self._emit(
            self.P.ExecCommandEndEvent(
                call_id=self.call_id,
                stdout=stdout,
                stderr=stderr,
                aggregated_output=aggregated,
                exit_code=result.returncode,
                duration=self.P.Duration.from_seconds(result.duration_s),
                formatted_output=aggregated,
            )
        )
