"""Which commands are known to be safe: they only read, and need no approval.

:func:`is_known_safe_command` follows Codex's ``is_known_safe_command``: a command is
known-safe when its argv is on a short allow-list of read-only programs, or when it is
``bash -lc SCRIPT`` (also ``-c``, ``sh`` and ``zsh``) whose script is nothing but plain
commands from that allow-list joined by ``&&``, ``||``, ``;``, ``|`` or newlines.

The allow-list, by how much of the argv it looks at:

=================  ===================================================================
any arguments      ``basename cat cd cut dirname echo expr false grep head id ls nl
                   paste pwd readlink realpath rev seq stat tail tr true uname wc which
                   whoami``
``find``           without ``-exec -execdir -ok -okdir -delete -fls -fprint -fprint0
                   -fprintf`` (they run commands, delete or write files)
``rg``             without ``--pre``, ``--hostname-bin`` (run a program) nor
                   ``-z``/``--search-zip`` (runs decompressors)
``git``            ``status``; ``log``/``diff``/``show`` without ``--output`` or
                   ``--ext-diff``; ``branch`` listing only (no name to create, no ``-d``,
                   ``-m``, ``-c``, ``-u``, ...); an optional leading ``--no-pager``
``sed``            exactly ``sed -n Np [FILE]`` or ``sed -n M,Np [FILE]``
``sort``           without ``-o``/``--output`` (writes a file), ``-T`` /
                   ``--temporary-directory``, ``--compress-program`` (runs a program)
``uniq``           at most one file operand (a second one is an *output* file)
``file``           without ``-C``/``--compile`` (writes ``magic.mgc``), ``-z``/``-Z``
                   (run decompressors)
``base64``         without ``-o``/``--output``
=================  ===================================================================

GNU long options may be abbreviated (``--out=f`` is ``--output=f``) and short ones
bundled (``-ro f`` is ``-r -o f``), so the checks match any prefix of a dangerous long
option and any bundle holding a dangerous letter. That refuses a few harmless spellings;
it never lets a dangerous one through. Program names must match exactly: ``./ls`` or
``/tmp/cat`` could be anything.

Shell scripts. Codex parses the script with tree-sitter-bash and accepts only commands
made of words and quoted strings joined by the operators above. This module does the
same with a small tokenizer that knows just that subset and refuses everything else:
redirections (``<``, ``>``), ``$`` in any form (variables, ``$(...)``, ``$((...))``),
backticks, subshells and groups (``(``, ``)``, ``{``, ``}``), background ``&``,
``|&``, ``!``, comments, here-documents and control characters. Single quotes,
double quotes (without ``$`` or backticks inside) and backslash escapes are read the
way the shell reads them, so ``"a b"`` is one argument and ``a\\ b`` too. A word with an
unquoted glob character (``*``, ``?``, ``[``) is expanded by the shell into names we
cannot see, so it is only accepted as an argument of the "any arguments" programs:
``ls *.py`` is safe, ``find . *`` is not (a file named ``-delete`` would become an
option).

Known-safe is a statement about the argv, not about the machine: ``git status`` runs
hooks that a repository's config names (``core.fsmonitor``), and a login shell sources
profile files. That is why sluice still runs known-safe commands in the sandbox (see
:mod:`agent.safety`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "PlainCommand",
    "is_known_safe_command",
    "is_safe_to_call_with_exec",
    "parse_plain_script",
    "shell_script_of",
]

# Programs that only read (or print), whatever their arguments.
SAFE_ANY_ARGS = frozenset(
    {
        "basename",
        "cat",
        "cd",
        "cut",
        "dirname",
        "echo",
        "expr",
        "false",
        "grep",
        "head",
        "id",
        "ls",
        "nl",
        "paste",
        "pwd",
        "readlink",
        "realpath",
        "rev",
        "seq",
        "stat",
        "tail",
        "tr",
        "true",
        "uname",
        "wc",
        "which",
        "whoami",
    }
)

_UNSAFE_FIND_OPTIONS = frozenset(
    {
        # run arbitrary commands
        "-exec",
        "-execdir",
        "-ok",
        "-okdir",
        # deletes what matches
        "-delete",
        # write path names to a file
        "-fls",
        "-fprint",
        "-fprint0",
        "-fprintf",
    }
)

# Shells whose `-c`/`-lc` script we look into. Bare names (found on PATH) or the usual
# absolute paths; a relative path like ./bash could be a program the model wrote.
_SHELLS = frozenset(
    {f"{d}{name}" for d in ("", "/bin/", "/usr/bin/") for name in ("bash", "sh", "zsh")}
)
_SHELL_FLAGS = frozenset({"-c", "-lc"})

_SED_N_ARG = re.compile(r"(?:[0-9]+,)?[0-9]+p")


# -- single commands ------------------------------------------------------------------


def _long_name(arg: str) -> str | None:
    """The name of a ``--name[=value]`` argument, or None if it is not one."""
    if not arg.startswith("--") or arg == "--":
        return None
    return arg[2:].split("=", 1)[0]


def _abbreviates(name: str, options: Sequence[str]) -> bool:
    """Whether ``--name`` is one of ``options`` or an abbreviation getopt would expand."""
    return bool(name) and any(option.startswith(name) for option in options)


def _short_bundle(arg: str) -> str | None:
    """The letters of a ``-abc`` argument (not ``-`` alone, not ``--...``), or None."""
    if len(arg) < 2 or arg[0] != "-" or arg[1] == "-":
        return None
    return arg[1:]


def _has_option(args: Sequence[str], letters: str, long_options: Sequence[str]) -> bool:
    """Whether any argument is one of the short ``letters`` (bundled or not) or one of
    ``long_options`` (possibly abbreviated). Over-matches, never under-matches."""
    for arg in args:
        name = _long_name(arg)
        if name is not None:
            if _abbreviates(name, long_options):
                return True
            continue
        bundle = _short_bundle(arg)
        if bundle is not None and any(letter in bundle for letter in letters):
            return True
    return False


def _operands(
    args: Sequence[str], short_with_value: str, long_with_value: Sequence[str]
) -> list[str]:
    """The non-option arguments of a GNU-style command line (options may come anywhere)."""
    operands: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            operands.extend(args[i:])
            break
        name = _long_name(arg)
        if name is not None:
            if "=" not in arg and _abbreviates(name, long_with_value):
                i += 1
            continue
        bundle = _short_bundle(arg)
        if bundle is None:
            operands.append(arg)
            continue
        for pos, letter in enumerate(bundle):
            if letter in short_with_value:
                if pos == len(bundle) - 1:
                    i += 1  # the value is the next argument
                break  # the rest of the bundle is the value
    return operands


def _is_safe_find(args: Sequence[str]) -> bool:
    return not any(arg in _UNSAFE_FIND_OPTIONS for arg in args)


def _is_safe_rg(args: Sequence[str]) -> bool:
    for arg in args:
        name = _long_name(arg)
        if name is not None:
            # ripgrep does not expand abbreviations, so exact names suffice.
            if name in ("pre", "hostname-bin", "search-zip"):
                return False
            continue
        bundle = _short_bundle(arg)
        if bundle is not None and "z" in bundle:
            return False
    return True


# `git branch` flags that only change how the list looks or which branches it shows.
_GIT_BRANCH_LIST_FLAGS = frozenset(
    {"list", "all", "remotes", "verbose", "show-current", "color", "no-color", "column",
     "no-column", "abbrev", "no-abbrev", "ignore-case", "omit-empty", "sort", "format",
     "contains", "no-contains", "merged", "no-merged", "points-at"}
)
# Flags that put `git branch` in list mode, where operands are patterns or commits.
_GIT_BRANCH_LIST_MODE = frozenset(
    {"list", "contains", "no-contains", "merged", "no-merged", "points-at"}
)
_GIT_BRANCH_SHORT_FLAGS = frozenset("arvl")


def _is_safe_git_branch(args: Sequence[str]) -> bool:
    list_mode = False
    operands = False
    for arg in args:
        name = _long_name(arg)
        if name is not None:
            # Exact names only: git would also take abbreviations, refusing them is fine.
            if name not in _GIT_BRANCH_LIST_FLAGS:
                return False
            list_mode = list_mode or name in _GIT_BRANCH_LIST_MODE
            continue
        bundle = _short_bundle(arg)
        if bundle is not None:
            if not set(bundle) <= _GIT_BRANCH_SHORT_FLAGS:
                return False
            continue
        if arg == "--":
            return False
        operands = True
    # Without list mode an operand names a branch to create (or start point).
    return list_mode or not operands


def _is_safe_git(args: Sequence[str]) -> bool:
    if args[:1] == ["--no-pager"]:
        args = args[1:]
    if not args:
        return False
    sub, rest = args[0], args[1:]
    if sub == "status":
        return True
    if sub in ("log", "diff", "show"):
        # --output writes the diff to a file; --ext-diff runs the configured diff program.
        for arg in rest:
            name = _long_name(arg)
            if name is not None and _abbreviates(name, ("output", "ext-diff")):
                return False
        return True
    if sub == "branch":
        return _is_safe_git_branch(rest)
    return False


def _is_safe_sed(args: Sequence[str]) -> bool:
    # Only the `sed -n 10p file` / `sed -n 5,20p file` idiom for printing lines.
    if len(args) not in (2, 3) or args[0] != "-n" or not _SED_N_ARG.fullmatch(args[1]):
        return False
    return len(args) == 2 or (args[2] != "" and not args[2].startswith("-"))


def _is_safe_sort(args: Sequence[str]) -> bool:
    return not _has_option(
        args, "oT", ("output", "temporary-directory", "compress-program")
    )


def _is_safe_uniq(args: Sequence[str]) -> bool:
    # `uniq IN OUT` writes OUT.
    operands = _operands(args, "fsw", ("skip-fields", "skip-chars", "check-chars"))
    return len(operands) <= 1


def _is_safe_file(args: Sequence[str]) -> bool:
    return not _has_option(args, "CzZ", ("compile", "uncompress", "uncompress-noreport"))


def _is_safe_base64(args: Sequence[str]) -> bool:
    return not _has_option(args, "o", ("output",))


_CHECKED = {
    "base64": _is_safe_base64,
    "file": _is_safe_file,
    "find": _is_safe_find,
    "git": _is_safe_git,
    "rg": _is_safe_rg,
    "sed": _is_safe_sed,
    "sort": _is_safe_sort,
    "uniq": _is_safe_uniq,
}


def is_safe_to_call_with_exec(argv: Sequence[str]) -> bool:
    """Whether ``argv``, executed directly (no shell), only reads."""
    if not argv or not all(isinstance(a, str) for a in argv):
        return False
    name, args = argv[0], list(argv[1:])
    if name in SAFE_ANY_ARGS:
        return True
    check = _CHECKED.get(name)
    return check is not None and check(args)


# -- shell scripts --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlainCommand:
    """One command of a plain script: its words as the shell would pass them."""

    argv: tuple[str, ...]
    globbed: bool
    """Some word has an unquoted ``*``, ``?`` or ``[``: the shell may expand it."""


_OPERATORS = ("&&", "||", "|", ";")
_NEWLINE = "\n"
# Unquoted, each of these starts syntax we do not accept: expansions, redirections,
# subshells, groups, brace expansion, background jobs, negation, comments.
_REJECTED = frozenset("$`<>(){}&!#")
_GLOB = frozenset("*?[")
_BLANKS = frozenset(" \t")
# In double quotes, a backslash escapes only these (otherwise it stays a backslash).
_DQ_ESCAPABLE = frozenset('$`"\\')


def _has_control_chars(text: str) -> bool:
    return any((ord(c) < 32 and c not in "\t\n") or ord(c) == 127 for c in text)


def _tokens(script: str) -> list[str | tuple[str, bool]] | None:
    """Operators (str) and words ((text, globbed)); None for anything outside the subset."""
    if _has_control_chars(script):
        return None
    out: list[str | tuple[str, bool]] = []
    word: list[str] = []
    in_word = False
    globbed = False
    i, n = 0, len(script)

    def end_word() -> None:
        nonlocal word, in_word, globbed
        if in_word:
            out.append(("".join(word), globbed))
        word, in_word, globbed = [], False, False

    while i < n:
        c = script[i]
        if c in _BLANKS:
            end_word()
            i += 1
        elif c == _NEWLINE:
            end_word()
            out.append(_NEWLINE)
            i += 1
        elif c in "|;&":
            end_word()
            two = script[i : i + 2]
            if two in ("&&", "||"):
                out.append(two)
                i += 2
            elif c == "&" or two in ("|&", ";;", ";&"):
                return None  # background job, |&, case terminators
            else:
                out.append(c)
                i += 1
        elif c == "'":
            end = script.find("'", i + 1)
            if end < 0:
                return None
            word.append(script[i + 1 : end])
            in_word = True
            i = end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= n:
                    return None
                d = script[i]
                if d == '"':
                    break
                if d in "$`":
                    return None
                if d == "\\":
                    if i + 1 >= n:
                        return None
                    e = script[i + 1]
                    if e in _DQ_ESCAPABLE:
                        word.append(e)
                        i += 2
                    elif e == _NEWLINE:
                        i += 2  # line continuation inside quotes
                    else:
                        word.append("\\")
                        i += 1
                    continue
                word.append(d)
                i += 1
            in_word = True
            i += 1
        elif c == "\\":
            if i + 1 >= n:
                return None
            e = script[i + 1]
            if e != _NEWLINE:  # backslash-newline joins lines
                word.append(e)
                in_word = True
            i += 2
        elif c in _REJECTED:
            return None
        else:
            if c in _GLOB:
                globbed = True
            word.append(c)
            in_word = True
            i += 1
    end_word()
    return out


def parse_plain_script(script: str) -> list[PlainCommand] | None:
    """The commands of a script made only of plain words joined by ``&&``, ``||``,
    ``;``, ``|`` and newlines; None if the script uses anything else or is not valid
    shell (an operator with no command on one side, an empty script)."""
    tokens = _tokens(script)
    if tokens is None:
        return None
    commands: list[PlainCommand] = []
    words: list[tuple[str, bool]] = []
    need_command = False  # after && || | another command must follow

    def finish() -> None:
        commands.append(
            PlainCommand(tuple(w for w, _ in words), any(g for _, g in words))
        )
        words.clear()

    for token in tokens:
        if isinstance(token, tuple):
            words.append(token)
        elif token == _NEWLINE:
            if words:
                finish()
                need_command = False
            # else: a blank line, or a line break after && || | (the shell reads on)
        else:
            if not words:
                return None  # `; ls`, `ls ;; x`, `&& ls`, `ls | | wc`
            finish()
            need_command = token != ";"
    if words:
        finish()
    elif need_command:
        return None
    return commands or None


def shell_script_of(argv: Sequence[str]) -> str | None:
    """The script of ``bash -lc SCRIPT`` (or ``-c``, ``sh``, ``zsh``), else None."""
    if len(argv) == 3 and argv[0] in _SHELLS and argv[1] in _SHELL_FLAGS:
        script = argv[2]
        return script if isinstance(script, str) else None
    return None


def _is_safe_plain_command(command: PlainCommand) -> bool:
    if command.globbed:
        # Expansion could turn into anything, options included; only programs that
        # ignore what their arguments say are safe. A globbed name is never on the list.
        return command.argv[0] in SAFE_ANY_ARGS
    return is_safe_to_call_with_exec(command.argv)


def is_known_safe_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is known to only read: an allow-listed command, or a shell
    ``-c``/``-lc`` script of nothing but allow-listed plain commands."""
    if is_safe_to_call_with_exec(argv):
        return True
    script = shell_script_of(argv)
    if script is None:
        return False
    commands = parse_plain_script(script)
    return commands is not None and all(_is_safe_plain_command(c) for c in commands)

