"""The network half of the ``sluice`` command line: keys, ``daemon --listen``, ``sluice executor``.

- ``sluice keys new NAME [--dir DIR]`` writes a CurveZMQ key pair (``NAME.key``, to share;
  ``NAME.key_secret``, mode 0600, to keep) in ``$SLUICE_HOME/keys``, else ``~/.sluice/keys``.
- ``sluice daemon --listen tcp://HOST:PORT --key FILE --allow DIR --allow-executors DIR``:
  the flags are checked here (:func:`listen_from_args`) so a mistake is one line before
  anything starts. ``--allow`` lists the keys that may join as frontends,
  ``--allow-executors`` those that may join as executors; either may be left out (that
  role is then not available over the network), not both.
- ``sluice executor --connect tcp://HOST:PORT --server-key FILE --key FILE`` runs an
  executor on this host for a daemon elsewhere; it is handed, arguments and all, to
  :mod:`executor` (the same program the daemon spawns locally).
"""

from __future__ import annotations

import os

from broker.cli.base import CliExit, print_error
from broker.net.keys import KeyFileError, default_keys_dir, load_public_key, new_key_pair
from broker.wire.results import EXIT_USAGE


def add_keys_args(keys) -> None:
    """``sluice keys``'s actions and their options, on its parser."""
    actions = keys.add_subparsers(dest="keys_action", metavar="{new}", required=True)
    new = actions.add_parser("new", help="write a new key pair", description="Write NAME.key and NAME.key_secret.")
    new.add_argument("name", metavar="NAME", help="a plain file name, e.g. the host's name")
    new.add_argument("--dir", metavar="DIR", default=None, help=f"where to write them (default: {default_keys_dir()})")


def add_listen_args(parser) -> None:
    parser.add_argument("--listen", metavar="tcp://HOST:PORT", default=None,
                        help="also accept frontends and executors over the network (CurveZMQ); needs --key, "
                             "and --allow and/or --allow-executors")
    parser.add_argument("--key", metavar="FILE", default=None,
                        help="with --listen: the daemon's key pair (NAME.key_secret from `sluice keys new NAME`)")
    parser.add_argument("--allow", metavar="DIR", default=None,
                        help="with --listen: a directory of the public keys (*.key) allowed to connect as "
                             "frontends (run commands); re-read when it changes")
    parser.add_argument("--allow-executors", metavar="DIR", default=None,
                        help="with --listen: a directory of the public keys (*.key) allowed to connect as "
                             "executors (receive commands to run); another directory than --allow; "
                             "without it no executor can join over the network")


def keys_main(args) -> int:
    if args.keys_action != "new":
        print_error("error: usage: sluice keys new NAME [--dir DIR]")
        return EXIT_USAGE
    directory = os.path.abspath(args.dir) if args.dir else default_keys_dir()
    try:
        public_path, secret_path = new_key_pair(directory, args.name)
    except KeyFileError as e:
        print_error(f"error: {e}")
        return EXIT_USAGE
    except OSError as e:
        print_error(f"error: cannot write keys in {directory}: {e.strerror}")
        return 1
    public = load_public_key(public_path).decode()
    print(f"public key file: {public_path}  (share it: a daemon's --allow or --allow-executors dir, "
          "or a client's --server-key)")
    print(f"secret key file: {secret_path}  (keep it here: pass it as --key)")
    print(f"public key: {public}", flush=True)
    return 0


def listen_from_args(args):
    """A :class:`broker.daemon.listener.Listen` for ``sluice daemon``'s flags, or None without ``--listen``.

    Mistakes are printed as one line and raised as :class:`CliExit`.
    """
    if not (args.listen or args.key or args.allow or args.allow_executors):
        return None
    from broker.daemon.listener import Listen, ListenError

    try:
        return Listen.from_args(args.listen, args.key, args.allow, args.allow_executors)
    except ListenError as e:
        print_error(f"error: {e}")
        raise CliExit(EXIT_USAGE) from None


def listen_argv(args) -> list[str]:
    """The flags that hand ``--listen`` on to a daemon started in the background (cwd ``/``)."""
    if not args.listen:
        return []
    argv = ["--listen", args.listen, "--key", os.path.abspath(args.key)]
    for flag, path in (("--allow", args.allow), ("--allow-executors", args.allow_executors)):
        if path:
            argv += [flag, os.path.abspath(path)]
    return argv


def executor_main(argv: list[str]) -> int:
    from executor.__main__ import main

    return main(argv, prog="sluice executor", error_prefix="sluice: error: ")
