"""Every command the documentation shows, run: the README and docs/*.md cannot drift from the code.

The convention (docs/README.md says it for writers): a fenced block marked ``sh runnable``
is a bash script, run here with ``bash -e -o pipefail`` in a scratch workspace of its own
against a real daemon, and must exit 0 (or N, marked ``exit=N``); a ``text output`` block
right after it is what it prints, stdout and stderr together, ``...`` standing for any
text within a line. A block marked ``sh synopsis`` is a command's usage: every flag it
names must be in that command's ``--help``. Other ``sh`` blocks cannot run here (an
install, another host, a terminal, a real model provider); UNMARKED counts them per page.

The environment is hermetic: the daemon's runtime dir, sluice's home, HOME and TMPDIR are
directories of this module's, PATH finds this checkout's ``sluice`` and the system's tools,
and nothing else of the caller's environment is passed on. The model is the scripted
server of tests/support/fake_model.py, answering every request with a short message: it
is the built-in ``openai`` provider (``OPENAI_BASE_URL``) and ``ollama`` (a
``[model_providers.ollama]`` table in ``config.toml``) alike.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from broker.net.runtime import RuntimeDir
from tests.support.docs import ROOT, Block, blocks, pages
from tests.support.fake_model import FakeModelServer, assistant, chat_chunk, response, sse
from tests.support.harness import short_tempdir, sluice_argv, stop_runtime_daemon, wait_for

pytestmark = pytest.mark.timeout(60)

# The sh blocks each page shows but no test can run here, and why.
UNMARKED = {
    "README.md": 3,  # the two installs (a fresh venv, pip), and commands for a terminal
    "docs/benchmarks.md": 1,  # an install, then minutes of benchmarks
    "docs/cli.md": 1,  # -t and -i: a person at a terminal
    "docs/mcp-server.md": 1,  # `claude mcp add`: Claude Code
    "docs/network.md": 1,  # a daemon on one host, frontends and executors on others
    "docs/ray.md": 1,  # a Ray cluster of several hosts
    "docs/web.md": 1,  # a reverse proxy (Caddy) in front of sluice web
}

ALL = [b for page in pages() for b in blocks(page)]
# A block that stops the daemon runs last, so that the others share one daemon and agent.
RUNNABLE = sorted((b for b in ALL if b.runnable), key=lambda b: "sluice daemon stop" in b.body)
SYNOPSES = [b for b in ALL if b.synopsis]
ANSWER = "Done: the scripted model answers every request so."


@pytest.fixture(scope="module")
def model():
    """The scripted model, answering every request, Responses API or Chat Completions."""
    with FakeModelServer() as server:

        def answer(handler) -> None:
            server.steps.append(answer)  # one taken, one put back: it never runs dry
            if handler.path.endswith("/chat/completions"):
                sse([chat_chunk({"role": "assistant", "content": ANSWER}), chat_chunk({}, "stop"),
                     b"data: [DONE]\n\n"])(handler)
            else:
                response(assistant(ANSWER))(handler)

        server.script(answer, answer, answer, answer)
        yield server


@pytest.fixture(scope="module")
def env(model):
    """The environment every block runs in; the daemon it starts is stopped at the end."""
    base = Path(short_tempdir("sl-docs-"))
    runtime = short_tempdir("sl-docs-rt-")
    home, sluice_home, tmp, bin_dir = (base / d for d in ("home", "sluice-home", "tmp", "bin"))
    for d in (home, sluice_home, tmp, bin_dir):
        d.mkdir(mode=0o700)
    (sluice_home / "config.toml").write_text(f'[model_providers.ollama]\nbase_url = "{model.base_url}"\n')
    # `sluice` on PATH is this checkout's, however it is installed.
    (bin_dir / "sluice").write_text("#!/bin/sh\nexec " + " ".join(sluice_argv()) + ' "$@"\n')
    (bin_dir / "sluice").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(ROOT),
        "SLUICE_RUNTIME_DIR": runtime,
        "SLUICE_HOME": str(sluice_home),
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-docs-scripted",  # a reader of a page past the README has set theirs
    }
    try:
        yield env
    finally:
        stop_runtime_daemon(RuntimeDir(runtime))
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def work(tmp_path) -> Path:
    """A scratch workspace: a small project to run the block in."""
    path = tmp_path / "project"
    path.mkdir()
    (path / "hello.py").write_text('def greet(name):\n    print("Hello " + name)\n')
    (path / "notes.txt").write_text("one\ntwo\n")
    return path


def sluice(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sluice", *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=30)


def daemon_ready(env: dict[str, str]) -> None:
    """The daemon runs and an executor has joined, so that no block's output holds the
    lines a first start adds (a block may stop the daemon: the next one finds one again)."""
    def executors() -> bool:
        status = sluice(env, "daemon", "status", "--json")
        return status.returncode == 0 and bool(json.loads(status.stdout)["executors"])

    if executors():
        return
    started = sluice(env, "daemon", "start")
    assert started.returncode == 0, started.stderr
    wait_for(executors, timeout=30, what="an executor joined", interval=0.1)


def matches(expected: str, actual: str) -> bool:
    """``actual`` line for line as ``expected`` shows it, ``...`` matching any text."""
    want, got = expected.rstrip("\n").split("\n"), actual.rstrip("\n").split("\n")
    return len(want) == len(got) and all(
        re.fullmatch(".*".join(map(re.escape, w.split("..."))), g) for w, g in zip(want, got))


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_a_runnable_block_runs_as_shown(block: Block, env, work) -> None:
    daemon_ready(env)
    p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.body], cwd=work, env=env,
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=45)
    assert p.returncode == block.exit_status, f"{block.id} exited {p.returncode}:\n{p.stdout}"
    if block.output is not None:
        assert matches(block.output, p.stdout), f"{block.id} printed:\n{p.stdout}\nnot as shown:\n{block.output}"


def commands(synopsis: str) -> list[str]:
    """The commands of a synopsis block, one line each (continuation lines joined, comments dropped)."""
    out: list[str] = []
    for line in synopsis.split("\n"):
        line = line.split(" #", 1)[0].rstrip()
        if line.startswith("sluice"):
            out.append(line)
        elif line.strip() and out:
            out[-1] += " " + line.strip()
    return out


def flags_missing(command: str, env: dict[str, str]) -> list[str]:
    """The flags a synopsis line names that its command's --help does not."""
    words = []
    for token in command.split()[1:]:
        if not re.fullmatch(r"[a-z][a-z-]*", token):
            break
        words.append(token)
    help_text = sluice(env, *words, "--help")
    assert help_text.returncode == 0, f"sluice {' '.join(words)} --help: {help_text.stderr}"
    return [f"{flag} (sluice {' '.join(words)})" for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", command)
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text.stdout)]


@pytest.mark.parametrize("block", SYNOPSES, ids=lambda b: b.id)
def test_every_flag_of_a_synopsis_is_in_its_commands_help(block: Block, env) -> None:
    missing = [flag for command in commands(block.body) for flag in flags_missing(command, env)]
    assert not missing, f"{block.id}: not in --help: {missing}"


def test_a_flag_no_command_has_is_found_missing(env) -> None:
    """The synopsis check cannot pass vacuously: a flag `sluice run` lacks is missing, a
    flag it has (also as a prefix of the missing one) is not."""
    assert flags_missing("sluice run [--network] [--network-everywhere] -- CMD", env) == [
        "--network-everywhere (sluice run)"]


def test_the_blocks_that_cannot_run_here_are_counted() -> None:
    """A new sh block is runnable, a synopsis, or counted here on purpose."""
    unmarked: dict[str, int] = {}
    for b in ALL:
        if b.lang == "sh" and not (b.runnable or b.synopsis):
            unmarked[b.page] = unmarked.get(b.page, 0) + 1
    assert unmarked == UNMARKED
    print("unmarked sh blocks per page:", ", ".join(f"{page} {n}" for page, n in sorted(unmarked.items())))
    assert RUNNABLE and SYNOPSES


def test_the_blocks_and_their_outputs_are_found() -> None:
    """The extraction and the comparison cannot pass vacuously: each page a reader runs
    commands from has runnable blocks, some show their output, and an output that differs
    (a line changed, one more line) does not match."""
    assert {"README.md", "docs/cli.md", "docs/sandbox.md", "docs/agent.md", "docs/sessions.md"} <= {
        b.page for b in RUNNABLE}
    assert any(b.output for b in RUNNABLE)
    assert matches("exit ...\nHELLO\n", "exit 124\nHELLO\n")
    assert not matches("exit ...\nHELLO\n", "exit 124\nhello\n")
    assert not matches("HELLO\n", "HELLO\nHELLO\n")
