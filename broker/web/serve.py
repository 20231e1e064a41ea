"""``sluice web``: serve the page, print its URL, run until Ctrl-C.

::

    sluice web [--port N] [--listen ADDR --certfile FILE --keyfile FILE] [--allow-host NAME]...
               [--open] [--new-token]

Listens on 127.0.0.1 (port 8642 by default; 0 picks a free one). ``--listen`` on any
other address needs TLS (``--certfile`` and ``--keyfile``): the token and the cookie must
not cross a network in clear text. Behind a reverse proxy that terminates TLS, keep the
default address and name the proxy's host with ``--allow-host``.

The token is kept in the runtime dir (``web-token``, mode 0600), so a restarted ``sluice
web`` lets in the browsers that were open (their cookie still holds); ``--new-token``
makes a new one, which shuts every earlier browser out.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys

from broker.net.runtime import RuntimeDir, RuntimeDirError, write_new
from broker.web.guard import new_token
from broker.wire.results import EXIT_OK, EXIT_SLUICE, EXIT_USAGE

DEFAULT_PORT = 8642
TOKEN_FILE = "web-token"


class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line instead of usage + message
            raise UsageError(f"{message} (see `sluice web --help`)")

    p = Parser(prog="sluice web", description="Serve the daemon's sessions as a web page.")
    p.add_argument("--listen", metavar="ADDR", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1; any other needs --certfile and --keyfile)")
    p.add_argument("--port", metavar="N", type=int, default=DEFAULT_PORT,
                   help=f"the port (default {DEFAULT_PORT}; 0: a free one)")
    p.add_argument("--certfile", metavar="FILE", help="TLS certificate (PEM), for --listen on another address")
    p.add_argument("--keyfile", metavar="FILE", help="TLS private key (PEM)")
    p.add_argument("--allow-host", metavar="NAME", action="append", default=[],
                   help="also answer to this Host (host or host:port), e.g. a reverse proxy's name; repeatable")
    p.add_argument("--open", action="store_true", help="open the page in a browser")
    p.add_argument("--new-token", action="store_true", help="make a new token (earlier browsers are shut out)")
    return p


def _loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _token(runtime: RuntimeDir, renew: bool) -> str:
    """The token kept in the runtime dir (checked as the daemon checks it: ours, 0700)."""
    dir_fd = runtime.open(create=True)
    try:
        if not renew:
            try:
                fd = os.open(TOKEN_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                with os.fdopen(fd) as f:
                    token = f.read().strip()
                if len(token) >= 32:
                    return token
            except FileNotFoundError:
                pass
        token = new_token()
        write_new(dir_fd, TOKEN_FILE, token.encode())
        return token
    finally:
        os.close(dir_fd)


def _bind(addr: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def hosts_and_origins(addr: str, port: int, scheme: str, extra: list[str]) -> tuple[set[str], set[str]]:
    """The ``Host`` values this server answers to and the ``Origin`` values it accepts."""
    names = {addr if ":" not in addr else f"[{addr}]"}
    if _loopback(addr):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    hosts = {f"{n}:{port}" for n in names}
    if (scheme, port) in (("http", 80), ("https", 443)):
        hosts |= names
    hosts |= {h.lower() for h in extra}
    origins = {f"{scheme}://{h}" for h in hosts}
    # Behind a TLS-terminating proxy the page's origin is https even though we speak http.
    origins |= {f"https://{h.lower()}" for h in extra}
    return hosts, origins


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        if not 0 <= args.port <= 65535:
            raise UsageError(f"--port must be 0-65535, got {args.port}")
        if bool(args.certfile) != bool(args.keyfile):
            raise UsageError("--certfile and --keyfile go together")
        for path in filter(None, (args.certfile, args.keyfile)):
            if not os.path.isfile(path):
                raise UsageError(f"no such file: {path}")
        if not _loopback(args.listen) and not args.certfile:
            raise UsageError(f"--listen {args.listen} is not a loopback address: give --certfile and --keyfile "
                             "(or keep 127.0.0.1 behind a reverse proxy that terminates TLS, with --allow-host)")
    except UsageError as e:
        print(f"sluice: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        runtime = RuntimeDir.default()
        token = _token(runtime, args.new_token)
    except (RuntimeDirError, OSError) as e:
        print(f"sluice: error: {e}", file=sys.stderr)
        return EXIT_SLUICE
    try:
        sock = _bind(args.listen, args.port)
    except OSError as e:
        print(f"sluice: error: cannot listen on {args.listen}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return EXIT_SLUICE

    import uvicorn

    from broker.web.app import make_app
    from broker.web.guard import Guard

    port = sock.getsockname()[1]
    scheme = "https" if args.certfile else "http"
    hosts, origins = hosts_and_origins(args.listen, port, scheme, args.allow_host)
    app = Guard(make_app(runtime, token), token=token, hosts=hosts, origins=origins, secure=scheme == "https")
    shown = args.listen if ":" not in args.listen else f"[{args.listen}]"
    url = f"{scheme}://{shown}:{port}/?token={token}"
    print(url, flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(url)
    config = uvicorn.Config(app, log_level="warning", ssl_certfile=args.certfile, ssl_keyfile=args.keyfile,
                            lifespan="on", timeout_graceful_shutdown=1, ws="none")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return EXIT_OK
