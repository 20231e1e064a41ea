"""The peers sluice is measured against, installed by the benchmark itself, and checked.

- ``codex``: OpenAI's Codex CLI, ``codex sandbox -- CMD`` (npm ``@openai/codex``), run
  with ``sandbox_mode = "workspace-write"`` (sluice's default policy: the command's
  directory writable, the rest read-only) and a ``CODEX_HOME`` of its own in the cache.
- ``srt``: Anthropic's sandbox runtime (npm ``@anthropic-ai/sandbox-runtime``), with a
  settings file of ours: the command's directory writable, no network. It needs
  ripgrep and socat.
- ``bwrap``: bubblewrap from the distribution, with the flags of :func:`bwrap_argv`.

The npm packages go to ``$SLUICE_BENCH_CACHE/npm`` (default ``~/.cache/sluice-bench``)
and are installed only when missing; distribution packages (bubblewrap, ripgrep, socat)
with ``apt-get`` only when missing, and only as root or with a sudo that asks for no
password. A peer that cannot be installed, or does not work here, is *unavailable*:
its rows are skipped with one line saying why, the rest of the run goes on.

Before a peer is timed, :func:`check` runs it on a probe: it must exit 0 with a
``true``, write a file in its working directory, and fail to write one outside it
(``~/.cache/sluice-bench/probe/outside``, not under /tmp, which Codex leaves writable).
A peer that is not sandboxed here would otherwise give a fast, meaningless figure.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 60

CODEX_PACKAGE = "@openai/codex"
SRT_PACKAGE = "@anthropic-ai/sandbox-runtime"
APT_PACKAGES = {"bwrap": "bubblewrap", "rg": "ripgrep", "socat": "socat"}


def cache_dir() -> str:
    """Where the peers (and the installed sluice) are kept between runs."""
    path = os.environ.get("SLUICE_BENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sluice-bench")
    os.makedirs(path, exist_ok=True)
    return path


@dataclass
class Peer:
    """A peer's command prefix (the command to run follows it), or why it is unavailable."""

    name: str
    prefix: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    unavailable: str = ""
    version: str = ""
    unset: tuple[str, ...] = ()  # variables its environment must not have

    def argv(self, command: Sequence[str]) -> list[str]:
        return [*self.prefix, *command]

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = {**(os.environ if base is None else base), **self.env}
        return {k: v for k, v in env.items() if k not in self.unset}

    def skip_line(self) -> str:
        return f"{self.name} skipped: {self.unavailable}"


# -- installing ------------------------------------------------------------------------------


def _run(argv: list[str], timeout: float = INSTALL_TIMEOUT_S, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                          check=False, **kw)


def _tail(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or proc.stdout or "").strip().splitlines()
    return text[-1][:200] if text else f"exit code {proc.returncode}"


def _as_root() -> list[str] | None:
    """The prefix that runs a command as root (none needed, or ``sudo -n``), or None."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and _run(["sudo", "-n", "true"], timeout=10).returncode == 0:
        return ["sudo", "-n"]
    return None


@functools.cache
def distro_tool(name: str) -> tuple[str | None, str]:
    """(path of program ``name``, "") or (None, why it is missing), installing its
    distribution package with apt-get when it can."""
    found = shutil.which(name)
    if found:
        return found, ""
    package = APT_PACKAGES[name]
    root = _as_root()
    if root is None or not shutil.which("apt-get"):
        how = "not root and no password-less sudo" if root is None else "no apt-get"
        return None, f"`{name}` not found and cannot install {package} ({how})"
    from common import log

    log(f"installing {package} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*root, "apt-get", "install", "-y", "-q", package]
    try:
        proc = _run(install, env=env)
        if proc.returncode != 0:  # perhaps no package lists yet
            _run([*root, "apt-get", "update", "-q"], env=env)
            proc = _run(install, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"apt-get install {package} failed: {e}"
    found = shutil.which(name)
    if not found:
        what = "did not put it on PATH" if proc.returncode == 0 else f"failed: {_tail(proc)}"
        return None, f"`{name}` not found and apt-get install {package} {what}"
    return found, ""


def npm_bin(package: str, binary: str) -> tuple[str | None, str]:
    """(path of ``binary`` from npm ``package`` in the cache, "") or (None, why not),
    installing the package with npm when it is missing."""
    prefix = os.path.join(cache_dir(), "npm")
    path = os.path.join(prefix, "node_modules", ".bin", binary)
    if os.access(path, os.X_OK):
        return path, ""
    if not shutil.which("npm"):
        return None, f"{package} is not in {prefix} and there is no npm to install it"
    from common import log

    log(f"installing {package} with npm into {prefix}")
    try:
        proc = _run(["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", "--loglevel=error", package])
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"npm install {package} failed: {e}"
    if proc.returncode != 0 or not os.access(path, os.X_OK):
        return None, f"npm install {package} failed: {_tail(proc)}"
    return path, ""


# -- the peers -------------------------------------------------------------------------------


@functools.cache
def codex() -> Peer:
    path, why = npm_bin(CODEX_PACKAGE, "codex")
    if not path:
        return Peer("codex", unavailable=why)
    home = os.path.join(cache_dir(), "codex-home")  # not under /tmp: codex refuses its helpers there
    os.makedirs(home, exist_ok=True)
    peer = Peer("codex", [path, "sandbox", "-c", 'sandbox_mode="workspace-write"', "--"], {"CODEX_HOME": home})
    return check(peer)


@functools.cache
def srt() -> Peer:
    for tool in ("rg", "socat"):
        found, why = distro_tool(tool)
        if not found:
            return Peer("srt", unavailable=why)
    path, why = npm_bin(SRT_PACKAGE, "srt")
    if not path:
        return Peer("srt", unavailable=why)
    settings = os.path.join(cache_dir(), "srt-settings.json")
    with open(settings, "w", encoding="utf-8") as f:
        json.dump({"filesystem": {"denyRead": [], "allowWrite": ["."], "denyWrite": []},
                   "network": {"allowedDomains": [], "deniedDomains": []}}, f)
    return check(Peer("srt", [path, "-s", settings]))


@functools.cache
def bwrap_path() -> tuple[str | None, str]:
    return distro_tool("bwrap")


def bwrap(cwd: str) -> Peer:
    """bubblewrap with the isolation of ``sluice sandbox``'s default policy, in ``cwd``."""
    path, why = bwrap_path()
    if not path:
        return Peer("bwrap", unavailable=why)
    return check(Peer("bwrap", bwrap_argv(path, cwd)))


def bwrap_argv(path: str, cwd: str) -> list[str]:
    """bubblewrap's flags for what ``sluice sandbox`` (workspace-write) gives a command.

    The same: the host's files read-only (``--ro-bind / /``) but the working directory
    (bound read-write), a private ``/tmp`` (a tmpfs: sluice binds a per-user directory),
    a fresh ``/proc`` and a private ``/dev``, new user, PID, IPC, network and UTS
    namespaces (sluice makes a network namespace too when the network is off, as here,
    and no UTS one), sluice's home and the user's runtime dir covered by
    empty tmpfs, no capabilities left (``--cap-drop ALL``, as sluice empties the
    bounding set), a session of its own (``--new-session``: no ``TIOCSTI`` into our
    terminal) and the tree killed with us (``--die-with-parent``).

    What bubblewrap does not do and sluice does: Landlock (a second, independent fence
    on writes beneath the writable roots, TCP bind/connect, abstract unix sockets,
    signals), seccomp (only ``AF_UNIX`` sockets, no ``ptrace`` or
    ``process_vm_readv/writev``, no setuid/setgid bits, brokered unix ``connect``),
    ``.git`` and ``.sluice`` kept read-only, the directories pinned by inode, the
    environment filtered of secrets, and resource limits. (Both end the whole tree when
    the command exits: bubblewrap's PID namespace has an init of its own too.)
    """
    argv = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--bind", cwd, cwd, "--chdir", cwd]
    home = os.environ.get("SLUICE_HOME") or os.path.join(os.path.expanduser("~"), ".sluice")
    for hidden in (home, os.environ.get("XDG_RUNTIME_DIR"), f"/run/user/{os.getuid()}"):
        if hidden and os.path.isdir(hidden) and not cwd.startswith(hidden.rstrip("/") + "/"):
            argv += ["--tmpfs", hidden]
    argv += ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts",
             "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--"]
    return argv


# -- checking --------------------------------------------------------------------------------


def probe_dirs() -> tuple[str, str]:
    """(a working directory for the probe, a path outside it and outside /tmp)."""
    base = os.path.join(cache_dir(), "probe")
    ws = os.path.join(base, "ws")
    os.makedirs(ws, exist_ok=True)
    return ws, os.path.join(base, "outside")


def check(peer: Peer) -> Peer:
    """``peer`` if it runs ``true`` (exit 0) and is sandboxed here, else it unavailable with why."""
    ws, outside = probe_dirs()
    if peer.name == "bwrap":  # its argv names its directory
        peer_ws = Peer(peer.name, bwrap_argv(peer.prefix[0], ws), peer.env, unset=peer.unset)
    else:
        peer_ws = peer
    inside = os.path.join(ws, "inside")
    for path in (inside, outside):
        if os.path.exists(path):
            os.unlink(path)
    try:
        proc = _run(peer_ws.argv(["true"]), timeout=RUN_TIMEOUT_S, cwd=ws, env=peer.environ())
        if proc.returncode != 0:
            return Peer(peer.name, unavailable=f"`{peer.name} ... true` exited {proc.returncode}: {_tail(proc)}")
        script = f"echo x > {inside}; echo x > {outside}; exit 0"
        proc = _run(peer_ws.argv(["sh", "-c", script]), timeout=RUN_TIMEOUT_S, cwd=ws, env=peer.environ())
    except (OSError, subprocess.TimeoutExpired) as e:
        return Peer(peer.name, unavailable=f"does not run here: {e}")
    try:
        if os.path.exists(outside):
            return Peer(peer.name, unavailable=f"not sandboxed here: a command wrote {outside}")
        if not os.path.exists(inside):
            return Peer(peer.name, unavailable=f"could not write in its working directory: {_tail(proc)}")
    finally:
        for path in (inside, outside):
            if os.path.exists(path):
                os.unlink(path)
    try:
        proc = _run([peer.prefix[0], "--version"], timeout=RUN_TIMEOUT_S)
        peer.version = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        pass
    return peer


_announced: set[str] = set()


def announce(peer: Peer) -> None:
    """Say once per run why ``peer`` is skipped (nothing when it is available)."""
    if peer.unavailable and peer.name not in _announced:
        _announced.add(peer.name)
        from common import log

        log(peer.skip_line())


def set_up() -> list[str]:
    """Install what is missing and check every peer; one line for each (run_all.py)."""
    from installed import sluice_cli

    lines = [f"sluice: {sluice_cli().kind}"]
    for peer in (codex(), srt(), bwrap(os.getcwd())):
        announce(peer)
        if not peer.unavailable:
            lines.append(f"{peer.name}: {peer.version or 'version unknown'} ({peer.prefix[0]})")
    return lines
