"""Attacks of a command on the descriptors it is handed as stdio, run by the user under
test (root, or ``nobody`` through setpriv: a pipe made by root cannot be reopened by
nobody, so the pipes and files must be the attacker's own user's, made here).

    python3 stdio_attacks.py ATTACK DIR PYTHON [PREFIX...]

runs ``PREFIX PYTHON -c <the attack's script>`` (no prefix: unsandboxed) with stdio made
for ``ATTACK`` (files in ``DIR``), and prints one JSON object: what the caller's
descriptors and files look like afterwards, and the command's exit code and stderr.
Stdlib only: it runs under any interpreter the user may execute.
"""

from __future__ import annotations

import json
import os
import select
import stat
import subprocess
import sys

# Each script tries its attack and says on stderr how it went; the caller's side is judged
# by what the driver sees afterwards, not by what the command says.
SCRIPTS = {
    # Reopen stdin (the pipe feeding us) for writing: lines for the shell that reads it.
    "inject": (
        "import os, sys\n"
        "try:\n"
        "    fd = os.open('/proc/self/fd/0', os.O_WRONLY)\n"
        "    os.write(fd, b'echo INJECTED\\n')\n"
        "    print('wrote', file=sys.stderr)\n"
        "except OSError as e:\n"
        "    print('refused', e.errno, file=sys.stderr)\n"
    ),
    # Reopen stdout for reading: take what another writer sent down the same pipe.
    "steal": (
        "import os, sys\n"
        "try:\n"
        "    fd = os.open('/proc/self/fd/1', os.O_RDONLY | os.O_NONBLOCK)\n"
        "    print('stole', os.read(fd, 4096), file=sys.stderr)\n"
        "except OSError as e:\n"
        "    print('refused', e.errno, file=sys.stderr)\n"
    ),
    # Leave O_NONBLOCK on every stdio description: the pipeline's next writer gets EAGAIN.
    "nonblock": (
        "import fcntl, os, sys\n"
        "for fd in (0, 1, 2):\n"
        "    try:\n"
        "        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)\n"
        "    except OSError as e:\n"
        "        print('refused', fd, e.errno, file=sys.stderr)\n"
    ),
    # Change the files given as stdin and stdout through their descriptors.
    "files": (
        "import os, sys\n"
        "for fd in (0, 1):\n"
        "    for name, change in (('fchmod', lambda: os.fchmod(fd, 0o666)), ('utime', lambda: os.utime(fd, (1, 1))),\n"
        "                         ('setxattr', lambda: os.setxattr(fd, 'user.sluice', b'changed'))):\n"
        "        try:\n"
        "            change()\n"
        "            print(name, fd, 'done', file=sys.stderr)\n"
        "        except OSError as e:\n"
        "            print(name, fd, 'refused', e.errno, file=sys.stderr)\n"
    ),
}
SECRET = b"a line another writer sent down the pipe\n"
TIMES = (1_500_000_000 * 10**9, 1_500_000_000 * 10**9)  # the command sets (1 s, 1 s)


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stderr=subprocess.PIPE, timeout=60, **kw)


def _pending(fd: int) -> bytes:
    """What a pipe holds now (without waiting)."""
    return os.read(fd, 65536) if select.select([fd], [], [], 0)[0] else b""


def _file(path: str) -> dict:
    st = os.stat(path)
    try:
        xattr = os.getxattr(path, "user.sluice").decode()
    except OSError:
        xattr = None
    return {"mode": oct(stat.S_IMODE(st.st_mode)), "mtime": st.st_mtime_ns, "xattr": xattr}


def main(attack: str, where: str, python: str, prefix: list[str]) -> dict:
    argv = [*prefix, python, "-c", SCRIPTS[attack]]
    if attack == "inject":
        r, w = os.pipe()  # w stays open: nothing but the command could write into it
        p = _run(argv, stdin=r, stdout=subprocess.DEVNULL)
        return {"code": p.returncode, "stderr": p.stderr.decode(), "injected": _pending(r).decode()}
    if attack == "steal":
        r, w = os.pipe()
        os.write(w, SECRET)
        p = _run(argv, stdin=subprocess.DEVNULL, stdout=w)
        return {"code": p.returncode, "stderr": p.stderr.decode(), "left": _pending(r).decode()}
    if attack == "nonblock":
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        p = _run(argv, stdin=r_in, stdout=w_out)
        return {"code": p.returncode, "stderr": p.stderr.decode(),
                "stdin_blocking": os.get_blocking(r_in), "stdout_blocking": os.get_blocking(w_out)}
    if attack == "files":
        files = {}
        for name in ("stdin", "stdout"):
            path = files[name] = os.path.join(where, name)
            with open(path, "wb") as f:
                f.write(b"the caller's file\n")
            os.chmod(path, 0o600)
            try:
                os.setxattr(path, "user.sluice", b"original")
            except OSError:
                pass  # a filesystem without user xattrs: _file says None
            os.utime(path, ns=TIMES)
        with open(files["stdin"], "rb") as stdin, open(files["stdout"], "ab") as stdout:
            p = _run(argv, stdin=stdin, stdout=stdout)
        return {"code": p.returncode, "stderr": p.stderr.decode(),
                **{name: _file(path) for name, path in files.items()}}
    raise SystemExit(f"unknown attack {attack!r}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])))
