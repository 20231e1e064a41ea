"""``sluice exec``: one task for the agent, shown as it happens.

::

    sluice exec [--model M] [--provider P] [--approval-policy P] [--sandbox MODE] [--cd DIR]
                [--json[=seed|codex]] [--output-last-message FILE] [-c key=value]... [--session ID] [--detach]
                [-v] [--connect tcp://HOST:PORT --server-key FILE --key FILE] PROMPT

The frontend resolves everything in its own process, against its own environment: the
configuration (flags, then ``-c`` overrides, then ``~/.sluice/config.toml``, then the
defaults) and the model provider with its API key (:func:`broker.cli.config.resolve_provider`),
so a daemon started earlier from another shell uses this caller's settings; and the
environment of the agent's commands, built from this process's under
``shell_environment_policy`` (secrets out, see :mod:`landlock_helper.env`) and sent with
the session, so the daemon and the executors never get the caller's secrets
(``--env-report`` names what the commands will not get). Then it
starts (or reuses) the daemon, opens a session (``configure_session``), submits PROMPT
(``-`` reads it from stdin), follows the session as ``sluice attach`` does (the one session
loop, :mod:`broker.cli.session_loop`; the events rendered by :mod:`broker.cli.render`) until
the task ends, and shuts the session down (its rollout flushed). ``experimental_resume = "PATH"``
(``-c experimental_resume=PATH``) resumes the conversation of a rollout file, as in Codex
(corrupt lines of it are skipped and said in one line; one that cannot be resumed is an
error and exit 1, never a fresh conversation in its place).
``--session ID`` (an id or a unique prefix of one; never starting a daemon, and an unknown
one said as ``sluice attach`` says it: :func:`broker.cli.attach.no_session`) continues a session that is already open
instead: it follows the session live from there (no replay) and leaves it open at the end.
``--detach`` starts the task and leaves it to the daemon: it prints the session id on
stdout and exits 0 once the daemon has the task; ``sluice attach ID`` follows it (and
answers its approvals, which wait for someone to attach).

``--json`` prints the events as JSON lines on stdout, as the seed protocol has them
(``--json=seed`` says the same); ``--json=codex`` prints them in Codex 0.169's ``codex exec
--json`` schema instead (:mod:`broker.cli.codex_json`), for scripts written against it.

Approvals are asked on the terminal (``y`` yes, ``a`` always for this session, ``n`` no,
``abort`` to end the task, ``v`` to see in full what the question cut short; the question
and the confirmation are :mod:`broker.cli.render`'s); without a terminal on stdin they
are denied, with a note (its hint once).
Another frontend attached to the session may answer first: the question is then dropped
and who answered is shown. Ctrl-C interrupts the turn (the running command's process tree
is killed); a second Ctrl-C leaves at once.

Exit status: 0 when the task completed, 1 when it failed (a model or session error, the
agent or the daemon gone) or its conversation could not be recorded (the rollout file
under a full ``SLUICE_HOME``: one line, ``error: rollout: no space left on device: PATH``,
and the task goes on to its end), 130 when interrupted, 2 for bad usage or configuration (a
missing API key included: the message names the variable to set).
"""

from __future__ import annotations

import argparse
import os
import sys

import broker.client as C
from agent.mcp.config import McpConfigError, parse_servers
from broker.cli.attach import NoSuchSession, connect, no_session, resolve_session
from broker.cli.base import (
    JSON_HELP,
    CliExit,
    add_connect_args,
    connect_client,
    print_error,
    take_json_format,
    write_all,
)
from broker.cli.config import ConfigError, default_config_path, load_config, resolve_provider
from broker.cli.render import CodexJsonRenderer, HumanRenderer, JsonRenderer
from broker.cli.session_loop import INPUT_ANSWERS, INPUT_NONE, SessionLoop, shut_down
from broker.cli.turns import isatty, rollout_failed, tag_of
from broker.wire.protocol import (
    UNSET,
    ConfigureSession,
    TextInput,
    UnifiedExecSettings,
    UserInput,
    parse_approval_policy,
)
from broker.wire.results import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from landlock_helper.env import describe_dropped
from landlock_helper.limits import Limits
from landlock_helper.policy import SandboxPolicy

# How long to wait for the session to shut down (rollout flushed) after the task.
SHUTDOWN_WAIT_S = 5.0
CONFIGURE_WAIT_S = 60.0

USAGE = "sluice exec [options] PROMPT"


def _parser(prog: str) -> argparse.ArgumentParser:
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line instead of usage + message
            print_error(f"error: {message} (see `{self.prog} --help`)")
            raise CliExit(EXIT_USAGE)

    p = Parser(prog=prog, usage=USAGE, description="Give the agent a task and watch it work.")
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help="the task; - reads it from stdin")
    p.add_argument("-m", "--model", metavar="M", help="the model (default: config, else gpt-5)")
    p.add_argument("--provider", metavar="P", help="a model provider: openai, ollama or one of [model_providers]")
    p.add_argument("-a", "--approval-policy", metavar="P",
                   help="untrusted, on-failure, on-request or never (default: config, else on-request)")
    p.add_argument("-s", "--sandbox", metavar="MODE",
                   help="read-only, workspace-write or danger-full-access (default: config, else read-only)")
    p.add_argument("-C", "--cd", metavar="DIR", help="the directory the agent works in (default: this one)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("-o", "--output-last-message", metavar="FILE", help="write the agent's last message to FILE")
    p.add_argument("-c", "--config", metavar="key=value", action="append", default=[], dest="overrides",
                   help="override a config.toml setting (TOML value); repeatable")
    p.add_argument("--session", metavar="ID",
                   help="continue this open session (id or unique prefix) instead of starting one")
    p.add_argument("--detach", action="store_true",
                   help="start the task, print the session id and exit; `sluice attach ID` follows it")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show every token count as it comes (default: the turn's sum at its end)")
    p.add_argument("--env-report", action="store_true",
                   help="first say on stderr which variables the commands will not get (names only)")
    add_connect_args(p)
    return p


def main(argv: list[str], prog: str = "sluice exec") -> int:
    """``sluice exec``, from :func:`broker.cli.main.main` (which makes its errors and
    interrupts exit codes)."""
    argv, json_format = take_json_format(argv)
    args = _parser(prog).parse_args(argv)
    args.json_format = json_format
    if args.detach and args.output_last_message:
        raise _usage("--output-last-message needs the task's end; it does not go with --detach")
    prompt = _read_prompt(args.prompt)
    if args.session:
        op, header, show_reasoning = None, {}, True
    else:
        op, header, show_reasoning = _configure_op(args)
    return _Exec(args, op, header, show_reasoning=show_reasoning).run(prompt)


def _usage(message: str) -> CliExit:
    print_error(f"error: {message}")
    return CliExit(EXIT_USAGE)


def _read_prompt(prompt: str | None) -> str:
    if prompt is None:
        raise _usage(f"missing PROMPT; usage: {USAGE}")
    source = "the prompt"
    if prompt == "-":
        source = "the prompt on stdin"
        try:
            prompt = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
        except OSError as e:
            raise _usage(f"cannot read the prompt from stdin: {e.strerror or e}") from None
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = prompt[e.start].encode("utf-8", "surrogateescape")
        offset = len(prompt[:e.start].encode("utf-8", "surrogateescape"))
        raise _usage(f"{source} is not valid UTF-8 (byte 0x{bad.hex()} at offset {offset}); "
                     "convert it first, e.g. with iconv") from None
    if not prompt.strip():
        raise _usage("the prompt is empty")
    return prompt


def _configure_op(args):
    """The ``configure_session`` op for this invocation, the header line's facts, and
    whether to show the agent's reasoning (``hide_agent_reasoning`` hides it)."""
    try:
        config = load_config(overrides=args.overrides)
        if args.provider is not None and args.provider not in config.model_providers:
            known = ", ".join(sorted(config.model_providers))
            where = config.path or default_config_path()
            raise _usage(f"--provider {args.provider}: no such model provider (known: {known}; "
                         f"define [model_providers.{args.provider}] in {where} to add one)")
        provider = resolve_provider(args.provider, config=config)
    except ConfigError as e:
        raise _usage(str(e)) from None
    if args.approval_policy is not None:
        try:
            approval = parse_approval_policy(args.approval_policy)
        except ValueError as e:
            raise _usage(str(e)) from None
    else:
        approval = config.approval_policy
    mode = args.sandbox or config.sandbox_mode
    workspace = mode == "workspace-write"
    try:
        policy = SandboxPolicy.from_mode(
            mode, config.writable_roots if workspace else (), config.network_access if workspace else False)
    except ValueError as e:
        raise _usage(str(e)) from None
    try:
        cwd = os.path.abspath(args.cd or os.getcwd())
    except FileNotFoundError:
        raise _usage("the current directory no longer exists; cd somewhere else or pass --cd") from None
    if not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        raise _usage(f"--cd {cwd} {what}")
    resume = config.raw.get("experimental_resume")
    if resume is not None and not isinstance(resume, str):
        raise _usage("experimental_resume must be the path of a rollout file")
    if resume is not None:
        resume = os.path.abspath(os.path.expanduser(resume))
        if not os.path.isfile(resume):
            raise _usage(f"experimental_resume: no rollout file at {resume}")
    # The commands' environment is built here, from ours, under the user's
    # shell_environment_policy: the secrets never leave this process.
    commands_env = config.shell_environment_policy.apply(os.environ)
    unified = config.unified_exec_settings()
    try:
        mcp_servers = parse_servers(config.raw.get("mcp_servers"))
    except McpConfigError as err:
        raise _usage(f"{config.path or 'config'}: {err}") from None
    if args.env_report:
        _env_report(commands_env)
    op = ConfigureSession(
        provider=provider.info,
        model=args.model or config.model,
        model_reasoning_effort=config.model_reasoning_effort or UNSET,
        model_reasoning_summary=config.model_reasoning_summary or UNSET,
        instructions=config.instructions,
        approval_policy=approval,
        sandbox_policy=policy,
        disable_response_storage=config.disable_response_storage,
        notify=list(config.notify) if config.notify else UNSET,
        cwd=cwd,
        resume_path=resume if resume is not None else UNSET,
        api_key=provider.api_key.reveal() if provider.api_key is not None else UNSET,
        env=commands_env.env,
        env_passthrough=commands_env.passthrough or UNSET,
        show_raw_agent_reasoning=config.show_raw_agent_reasoning or UNSET,
        limits=config.limits if config.limits != Limits() else UNSET,
        mcp_servers=mcp_servers or UNSET,
        unified_exec=unified if unified != UnifiedExecSettings() else UNSET,
    )
    header = {"provider": provider.id, "approval": str(approval), "sandbox": mode, "cwd": cwd}
    return op, header, not config.hide_agent_reasoning


def _env_report(commands_env) -> None:
    """``--env-report``: the names (never the values) the commands will not get."""
    hint = "shell_environment_policy.ignore_default_excludes = true keeps them"
    line = describe_dropped(commands_env.dropped_secret, hint)
    if commands_env.left_out:
        line += f"; left out by shell_environment_policy: {', '.join(commands_env.left_out)}"
    print_error(f"environment: {line}")


class _Exec:
    """One run: connect, open (or join) the session, submit, follow it with the session
    loop until the task ends, shut down the session it opened."""

    def __init__(self, args, op, header: dict[str, str], *, show_reasoning: bool = True) -> None:
        self.args = args
        self.op = op
        self.cwd = header.get("cwd", "")
        # JSON lines carry every event; hide_agent_reasoning is about what a person reads.
        if args.json:
            self.render = CodexJsonRenderer() if args.json_format == "codex" else JsonRenderer()
        else:
            self.render = HumanRenderer(header, show_reasoning=show_reasoning, verbose=args.verbose)
        self.loop: SessionLoop | None = None

    def run(self, prompt: str) -> int:
        if self.op is None:
            # An existing session: never start a daemon for it (none running, no session).
            try:
                client = connect(self.args, "sluice exec", autostart=False, session=self.args.session)
            except NoSuchSession as e:
                return no_session(e, self.render)
        else:
            client = connect_client(self.args, name="sluice exec")
        self.render.me = client.peer_id
        with client, client.catch_signals():
            try:
                return self._run(client, prompt)
            except (C.DaemonError, C.SessionError) as e:
                return self._fail(str(e))
            finally:
                self.render.finish()

    def _fail(self, message: str) -> int:
        self.render.error(message)
        if self.args.json:
            print_error(f"error: {message}")
        return EXIT_FAILED

    def _run(self, client, prompt: str) -> int:
        info = None
        if self.op is None:
            try:
                info = resolve_session(client, self.args.session)
            except NoSuchSession as e:
                return no_session(e, self.render)
            session = client.session(info.id)
            if isinstance(self.render, CodexJsonRenderer):
                self.render.thread(info.id)  # followed from here: no session_configured comes
        else:
            session = client.open_session(self.op, sub_id="0")
        input_mode = INPUT_ANSWERS if isatty(0) else INPUT_NONE
        loop = self.loop = SessionLoop(client, session, self.render, input_mode=input_mode, until_idle=True,
                                       one_task=True, info=info)
        loop.cwd = loop.cwd or self.cwd
        if self.op is not None:
            code = self._wait_configured()
            if code is not None:
                self._shutdown()
                return code
        if isinstance(self.render, HumanRenderer):
            self.render.own_inputs.append(prompt)
        loop.submit(UserInput([TextInput(prompt)]))
        if self.args.detach:
            return self._detach(client)
        code = loop.run()
        if code == EXIT_INTERRUPTED and not loop.interrupted:
            code = EXIT_FAILED  # aborted, and not by us
        if code == EXIT_OK:
            self._write_last_message(loop.view.last_message)
        if self.op is not None:
            self._shutdown(wait=not loop.left_on_signal)
        if code == EXIT_OK and loop.unrecorded:
            code = EXIT_FAILED  # done, but not recorded: the caller must know
        return code

    def _detach(self, client) -> int:
        """Leave the task to the daemon once it has it; the session id on stdout."""
        # The daemon answers in the order it is asked: once it has listed its sessions it
        # has taken the submission too (closing the socket could otherwise drop it).
        client.list_sessions()
        session_id = self.loop.session.id
        write_all(1, f"{session_id}\n".encode())
        if not self.args.json:
            self.render.note(f"the task goes on in the daemon; `sluice attach {session_id[:8]}` follows it")
        return EXIT_OK

    def _wait_configured(self) -> int | None:
        while True:
            try:
                event = self.loop.session.next_event(CONFIGURE_WAIT_S)
            except C.Interrupted:
                return EXIT_INTERRUPTED
            if event is None:
                self.render.error(f"the agent did not configure the session within {CONFIGURE_WAIT_S:g} s")
                return EXIT_FAILED
            if not self.args.detach or tag_of(event) == "error":
                self.loop.show(event)
            tag = tag_of(event)
            if tag == "session_configured":
                return None
            if tag == "error" and not rollout_failed(event):
                return EXIT_FAILED

    # -- ending -------------------------------------------------------------------------

    def _write_last_message(self, message: str | None) -> None:
        path = self.args.output_last_message
        if not path:
            return
        if message is None:
            self.render.note(f"the agent sent no last message; {path} is left empty")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(message or "")
        except OSError as e:
            self.render.note(f"cannot write {path}: {e.strerror}")

    def _shutdown(self, *, wait: bool = True) -> None:
        """Shut the session down (rollout flushed); render what it says meanwhile."""
        def show(event) -> None:
            if self.args.json or rollout_failed(event):
                self.loop.show(event)

        try:
            shut_down(self.loop.session, SHUTDOWN_WAIT_S if wait else 0, show)
        except C.DaemonError:
            pass  # the daemon is gone, and the session with it
