"""Session frontends in tests: ``sluice exec/attach/sessions/bridge`` as processes on pipes and ptys.

:class:`Frontends` runs the real command line against a test daemon, with its own
SLUICE_HOME whose ``config.toml`` points the ``fake`` provider at a scripted model
(:class:`tests.fake_model.FakeModelServer`), its key in ``$FAKE_KEY``.

:func:`dmn`, :func:`work` and :func:`fe` are the fixtures of modules of such tests
(offered to every test by tests/conftest.py; a module that needs another daemon or
workspace defines its own of that name).

:class:`OnPty` is one such process with a pseudo-terminal as its controlling terminal, so
``^C`` and ``^D`` typed at the master reach it as they would from a person (the line
discipline turns ``^C`` into SIGINT for its process group, ``^D`` into end of input).
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import subprocess
import termios
import time
from pathlib import Path

import pytest

from broker.wire.protocol import (
    AskForApproval,
    ConfigureSession,
    ModelProviderInfo,
    Submission,
    WireApi,
    decode_event_json,
    encode_json,
)
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import tag
from tests.support.harness import daemons, short_tempdir, sluice_argv, subprocess_env

KEY = "sk-frontends-test-7d1e40b2"


def json_events(stdout: str | bytes) -> list:
    text = stdout.decode() if isinstance(stdout, bytes) else stdout
    return [decode_event_json(line) for line in text.splitlines() if line.strip()]


def configure_op(server, cwd: Path, *, approval: str = "never", sandbox: str = "read-only") -> ConfigureSession:
    return ConfigureSession(
        provider=ModelProviderInfo(name="scripted", base_url=server.base_url, wire_api=WireApi.RESPONSES),
        model="test-model", approval_policy=AskForApproval(approval),
        sandbox_policy=SandboxPolicy.from_mode(sandbox), cwd=str(cwd), api_key=KEY)


def submission_line(sub_id: str, op) -> bytes:
    return encode_json(Submission(sub_id, op)) + b"\n"


class JsonLines:
    """A process's stdout read as JSON event lines, as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.fd = proc.stdout.fileno()
        self.events: list = []
        self._buffer = b""

    def until(self, predicate, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            for event in self.events[checked:]:
                if predicate(event):
                    return event
            checked = len(self.events)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                raise AssertionError(f"no such event in {[tag(e) for e in self.events]}")
            data = os.read(self.fd, 65536)
            if not data:
                raise AssertionError(f"stdout ended; events: {[tag(e) for e in self.events]}")
            *lines, self._buffer = (self._buffer + data).split(b"\n")
            self.events += json_events(b"\n".join(lines))

    def rest(self) -> list:
        data = self._buffer
        while chunk := os.read(self.fd, 65536):
            data += chunk
        self.events += json_events(data)
        return self.events


class Frontends:
    """How the frontends are run in these tests: one SLUICE_HOME with a config.toml (the
    scripted model's provider, speaking ``wire_api``, plus ``extra_config``), its key
    ``key`` in ``$FAKE_KEY``."""

    def __init__(self, runtime, server, home: Path, *, key: str = KEY, wire_api: str = "responses",
                 extra_config: str = "") -> None:
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'model = "test-model"\nmodel_provider = "fake"\n{extra_config}\n'
            f'[model_providers.fake]\nname = "scripted"\nbase_url = "{server.base_url}"\n'
            f'env_key = "FAKE_KEY"\nwire_api = "{wire_api}"\n')
        self.env = subprocess_env(runtime, SLUICE_HOME=str(home), FAKE_KEY=key, NO_COLOR="1")
        self.env.pop("OPENAI_API_KEY", None)

    def argv(self, *args: str) -> list[str]:
        return [*sluice_argv(), *args]

    def run(self, *args: str, input: bytes | str = "", timeout: float = 30) -> subprocess.CompletedProcess:
        """The command run to its end, stdin ``input``; its output as text."""
        if isinstance(input, bytes):
            input = input.decode()
        return subprocess.run(self.argv(*args), env=self.env, input=input, capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, *args: str, stdin=subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), env=self.env, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def on_pty(self, *args: str) -> OnPty:
        return OnPty(self.argv(*args), self.env)


def _take_terminal() -> None:
    # In the child, after setsid: the pty on stdin becomes the controlling terminal.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class OnPty:
    """A process whose stdin, stdout and stderr are one pseudo-terminal, its controlling one."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        try:
            self.proc = subprocess.Popen(argv, env=env, stdin=slave, stdout=slave, stderr=slave,
                                         start_new_session=True, preexec_fn=_take_terminal)
        finally:
            os.close(slave)
        self.seen = bytearray()

    def write(self, data: bytes) -> None:
        os.write(self.master, data)

    def read_until(self, needle: bytes, timeout: float = 20.0, count: int = 1) -> bytes:
        """Read until ``needle`` has shown up ``count`` times in all output so far."""
        deadline = time.monotonic() + timeout
        while self.seen.count(needle) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.master], [], [], remaining)[0]:
                raise AssertionError(f"no {needle!r} in {bytes(self.seen)[-3000:]!r}")
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the process is gone and the pty with it
                data = b""
            if not data:
                raise AssertionError(f"output ended without {needle!r}: {bytes(self.seen)[-3000:]!r}")
            self.seen += data
        return bytes(self.seen)

    def wait(self, timeout: float = 20.0) -> int:
        code = self.proc.wait(timeout)
        self._drain()
        return code

    def _drain(self) -> None:
        while select.select([self.master], [], [], 0)[0]:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.seen += data

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)

    def __enter__(self) -> OnPty:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dmn():
    """The daemon of a module of frontend tests: two executors, and a sluice home of the
    module's own, so that its sessions and rollouts stay apart from other modules'."""
    with daemons() as factory:
        yield factory.start(executors=2, env={"SLUICE_HOME": short_tempdir("sl-fe-home-")})


@pytest.fixture
def work(tmp_path) -> Path:
    """An empty workspace of the test's own."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def fe(dmn, server, tmp_path) -> Frontends:
    """The command line against ``dmn`` and the scripted model ``server``."""
    return Frontends(dmn.runtime, server, tmp_path / "fe-home")
