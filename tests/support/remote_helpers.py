"""Shared by the network tests: key pairs, free ports, waiting, and log lines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass

import psutil

from broker.net.keys import load_public_key, new_key_pair
from tests.support.harness import ROOT, sluice_argv, subprocess_env


@dataclass
class Keys:
    """A daemon key pair, allowed pairs (their .key in ``allow`` for frontends, in
    ``executors`` for executors) and a stranger: ``client`` may join as a frontend,
    ``worker`` as an executor."""

    dir: str
    allow: str
    executors: str

    def pair(self, name: str, *, allowed: bool, role: str = "frontend") -> tuple[str, str]:
        public, secret = new_key_pair(self.dir, name)
        if allowed:
            self.allow_key(public, role)
        return public, secret

    def allow_key(self, public_path: str, role: str = "frontend") -> None:
        # Written under a temporary name and renamed in, as a careful admin would.
        directory = self.executors if role == "executor" else self.allow
        name = os.path.basename(public_path)
        tmp = os.path.join(directory, f".{name}.tmp")
        with open(public_path, "rb") as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.replace(tmp, os.path.join(directory, name))

    def public(self, name: str) -> str:
        return load_public_key(os.path.join(self.dir, f"{name}.key")).decode()


def make_keys(base: str) -> Keys:
    keys = Keys(os.path.join(base, "keys"), os.path.join(base, "allow"), os.path.join(base, "allow-executors"))
    os.makedirs(keys.allow, mode=0o700)
    os.makedirs(keys.executors, mode=0o700)
    new_key_pair(keys.dir, "daemon")
    keys.pair("client", allowed=True)
    keys.pair("worker", allowed=True, role="executor")
    keys.pair("stranger", allowed=False)
    return keys


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listen_args(keys: Keys, endpoint: str, *, executors: bool = True) -> list[str]:
    """``--listen`` with the daemon's key, the frontends' allow dir and (``executors``) the executors'."""
    args = ["--listen", endpoint, "--key", os.path.join(keys.dir, "daemon.key_secret"), "--allow", keys.allow]
    return [*args, "--allow-executors", keys.executors] if executors else args


def connect_args(keys: Keys, endpoint: str, name: str = "client") -> list[str]:
    return ["--connect", endpoint, "--server-key", os.path.join(keys.dir, "daemon.key"),
            "--key", os.path.join(keys.dir, f"{name}.key_secret")]


def log_events(text: str, event: str) -> list[dict]:
    """The JSON log lines of ``text`` whose event is ``event``."""
    found = []
    for line in text.splitlines():
        if f'"{event}"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            found.append(record)
    return found


def marker() -> str:
    """A sleep duration no other process has on its command line: ``sleep MARKER``."""
    return f"1000.{uuid.uuid4().int % 10**9:09d}"


def sleepers(mark: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd[:1] == ["sleep"] and mark in cmd:
            found.append(p)
    return found


def start_executor(argv_prefix: list[str], args: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen:
    """``sluice executor ARGS`` (behind ``argv_prefix``, e.g. ``ip netns exec B``), logging to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen([*argv_prefix, sys.executable, "-m", "broker", "executor", *args], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT, start_new_session=True)


def kill_tree(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    """SIGKILL ``proc`` and everything beneath it if it still runs; its exit status."""
    if proc.poll() is None:
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(tree, timeout=timeout)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
    return proc.returncode


def run_sluice(args, env=None, timeout: float = 30) -> subprocess.CompletedProcess:
    """``sluice ARGS...`` run to the end in /tmp, text output."""
    return subprocess.run([*sluice_argv(), *args], capture_output=True, text=True, timeout=timeout,
                          env=env or subprocess_env(), stdin=subprocess.DEVNULL, cwd="/tmp")


def one_line(text: str) -> str:
    """The one line of ``text`` (a refusal is one line, never a traceback)."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]
