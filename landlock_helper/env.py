"""The environment a sandboxed command gets: the caller's, minus anything secret.

This module is the one place sluice decides what counts as a secret in an environment.
Frontends filter with it before an environment leaves the caller's machine
(``sluice run``, the client library, ``sluice exec``), the executor filters again before
the command starts, the daemon keeps it out of its own environment, and the log
redaction uses it too. Stdlib only.

A variable is secret when :func:`is_secret` says so, by its name or by its value:

**Names** are split into words: on anything that is not a letter or digit, and where a
lower-case letter meets an upper-case one (``npm_config__authToken``: npm, config, auth,
Token). Whole words are compared, never substrings, so ``TOKENIZERS_PARALLELISM``,
``GIT_AUTHOR_NAME``, ``KEYBOARD`` and ``MONKEY`` stay while ``GH_PAT`` and ``MYSQL_PWD``
go. A name is secret when a word

- is one of :data:`SECRET_WORDS` (``KEY``, ``TOKEN``, ``PAT``, ``PWD``, ``PASS``,
  ``AUTH``, ``JWT``, ``DSN``, ``WEBHOOK``, ...);
- contains one of :data:`SECRET_STEMS`, words that hide inside no ordinary word
  (``SECRET``, ``PASSWORD``, ``PASSWD``, ``PASSPHRASE``, ``CREDENTIAL``, ``COOKIE``),
  e.g. ``CLIENTSECRET``;
- ends with one of :data:`SECRET_SUFFIXES`: ``TOKEN`` (``GHTOKEN``, ``AUTHTOKEN``, but
  not ``TOKENIZER``) or a key compound (``APIKEY``, ``ACCESSKEY``, ..., but not
  ``MONKEY``).

Exceptions, decided one by one:

- ``PWD`` and ``OLDPWD`` themselves are the shell's directories, not passwords
  (``MYSQL_PWD`` is one).
- ``TOKENS`` (plural) is a count in every real name (``MAX_TOKENS``,
  ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``), so it is not a secret word; ``TOKEN`` is.
- ``SESSION`` is no secret word: ``XDG_SESSION_TYPE``, ``DESKTOP_SESSION`` are harmless,
  and ``AWS_SESSION_TOKEN`` goes by its ``TOKEN``.
- A name whose last word is ``FILE``, ``PATH``, ``DIR`` or ``HOME`` with a value that is
  a path (``/...`` or ``~...``) points at a secret rather than holding one
  (``AWS_SHARED_CREDENTIALS_FILE``, ``PASSWORD_STORE_DIR``, ``SSH_KEY_PATH``): kept, as
  the command could read that file anyway in the modes that read everything.
  ``GOOGLE_APPLICATION_CREDENTIALS`` (a path under a secret-looking name of another
  shape) is dropped; ``--env`` passes it.

**Values** are secret, whatever the name, when they carry a credential: a URL with a
password (``postgres://u:pw@db/x``, ``http://user:pass@proxy:3128``) or with a
token-like user name (``https://ghp_...@github.com``, a Sentry DSN); ``password=``,
``pwd=``, ``token=`` and the like in a connection string (``host=db password=pw``,
``Server=x;Pwd=pw``, ``?user=u&password=pw``); ``Bearer``/``Basic`` credentials; or a
token of a well-known shape (GitHub ``ghp_``/``github_pat_``, GitLab ``glpat-``, Slack
``xox?-``, OpenAI/Anthropic ``sk-``, AWS ``AKIA``/``ASIA`` key ids, Google ``AIza``, npm,
Hugging Face, PyPI, a JWT, a PEM private key).

**Handles** that reach outside the sandbox are dropped although they are not secrets:
:data:`ALWAYS_DROPPED` (an ssh or gpg agent, the session bus, the X session manager) and
``SLUICE_*`` (the daemon's own settings).

A name the caller passes explicitly (``--env NAME``, ``env_passthrough``) is kept
whatever it looks like.

:class:`ShellEnvironmentPolicy` is Codex's ``shell_environment_policy`` (inherit,
default excludes, exclude, set, include_only, in that order), with this module's rule
as its default excludes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Whole words that make a name secret.
SECRET_WORDS = frozenset({
    "KEY", "KEYS",                    # API_KEY, AWS_SECRET_ACCESS_KEY, SSH_KEYS
    "TOKEN",                          # GITHUB_TOKEN (but see TOKENS above)
    "SECRET", "SECRETS",
    "PASSWORD", "PASSWORDS", "PASSWD", "PASSPHRASE", "PASSCODE",
    "PASS",                           # DB_PASS, SMTP_PASS
    "PWD",                            # MYSQL_PWD, DB_PWD (PWD and OLDPWD themselves excepted)
    "PAT",                            # GH_PAT, AZURE_DEVOPS_PAT: personal access tokens
    "CREDENTIAL", "CREDENTIALS", "CREDS",
    "AUTH", "AUTHORIZATION",          # NPM_CONFIG__AUTH, DOCKER_AUTH_CONFIG, HTTP_AUTHORIZATION
    "COOKIE", "COOKIES",
    "PRIVATE",                        # PRIVATE_KEY, GITLAB_PRIVATE_TOKEN
    "JWT",                            # CI_JOB_JWT, CI_JOB_JWT_V2
    "DSN",                            # SENTRY_DSN, DATABASE_DSN: a URL with a key in it
    "WEBHOOK", "WEBHOOKS",            # SLACK_WEBHOOK_URL: whoever has the URL may post
    "OTP", "TOTP",
})
# Stems that make a word secret wherever they are in it (CLIENTSECRET, DBPASSWORD).
SECRET_STEMS = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "COOKIE")
# Endings that make a word secret (GHTOKEN, OPENAIAPIKEY); "KEY" alone is no ending
# (MONKEY, TURKEY), only its compounds are.
SECRET_SUFFIXES = (
    "TOKEN", "APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY", "PRIVKEY", "AUTHKEY",
    "MASTERKEY", "SIGNINGKEY", "LICENSEKEY", "ENCRYPTIONKEY", "SSHKEY", "DEPLOYKEY",
)
# Names that contain a secret word but are not secrets.
NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})
# Last words of names that point at a secret (a file) rather than hold one.
POINTER_WORDS = frozenset({"FILE", "PATH", "DIR", "HOME"})

# Not secrets by name, but handles that reach outside the sandbox or the daemon.
ALWAYS_DROPPED = frozenset({"SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "GPG_AGENT_INFO", "SESSION_MANAGER"})
ALWAYS_DROPPED_PREFIXES = ("SLUICE_",)

# Shell's CORE variables, as Codex's ``inherit = "core"`` keeps them.
CORE_VARS = ("HOME", "LOGNAME", "PATH", "SHELL", "USER", "USERNAME", "TMPDIR", "TEMP", "TMP")
INHERIT_CHOICES = ("all", "core", "none")

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# Left boundary for a token shape: not inside a word or a path component.
_B = r"(?<![A-Za-z0-9/._-])"
_SECRET_VALUE = re.compile(
    "|".join((
        # scheme://user:password@ (the user may be empty: redis://:pw@host)
        r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@",
        # scheme://TOKEN@ (a token as the user name: GitHub, Sentry DSNs)
        r"[A-Za-z][A-Za-z0-9+.-]*://[A-Za-z0-9_-]{20,}@",
        # key=value credentials in connection strings and query strings
        r"(?i:(?:^|[\s;&?,])(?:password|passwd|pwd|pass|secret|token|api[_-]?key|access[_-]?key|auth)\s*=\s*[^\s;&,])",
        # Bearer/Basic credentials (a digit in it, so prose like "a basic configuration-tool" stays)
        r"(?i:\b(?:bearer|basic)\s+)(?=[A-Za-z._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{16,}",
        _B + r"gh[pousr]_[A-Za-z0-9]{30,}",
        _B + r"github_pat_[A-Za-z0-9_]{20,}",
        _B + r"glpat-[A-Za-z0-9_-]{20,}",
        _B + r"xox[abposr]-[A-Za-z0-9-]{10,}",
        _B + r"sk-[A-Za-z0-9_-]{32,}",
        _B + r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])",
        _B + r"AIza[0-9A-Za-z_-]{35}",
        _B + r"npm_[A-Za-z0-9]{36}",
        _B + r"hf_[A-Za-z0-9]{30,}",
        _B + r"pypi-[A-Za-z0-9_-]{50,}",
        _B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    ))
)


def name_words(name: str) -> list[str]:
    """The words of a variable name, upper-cased (see the module docstring)."""
    return [w.upper() for w in _WORD.findall(name)]


_STEM = re.compile("|".join(SECRET_STEMS))
# What every value pattern above needs somewhere in the value: most values (paths,
# names, flags) have none of it and skip the patterns.
_VALUE_HINT = re.compile(r"://|=|gh[pousr]_|github_pat_|glpat-|xox[abposr]-|sk-|AKIA|ASIA|AIza|npm_|hf_|pypi-|eyJ"
                         r"|-----BEGIN|(?i:bearer|basic)")


# Every secret word, stem and ending as a substring: a name with none of them (most are)
# needs no splitting into words.
_ANY_PART = re.compile("|".join(sorted({*SECRET_WORDS, *SECRET_STEMS, *SECRET_SUFFIXES}, key=len, reverse=True)))


def _secret_word(word: str) -> bool:
    return word in SECRET_WORDS or word.endswith(SECRET_SUFFIXES) or _STEM.search(word) is not None


def is_secret_name(name: str, value: str | None = None) -> bool:
    """Whether ``name`` is a secret's name or a handle out of the sandbox.

    ``value``, when given, only decides the pointer exception (a ``..._FILE`` whose value
    is a path); it is not itself checked (see :func:`is_secret`).
    """
    upper = name.upper()
    if upper in ALWAYS_DROPPED or upper.startswith(ALWAYS_DROPPED_PREFIXES):
        return True
    if upper in NOT_SECRET_NAMES or _ANY_PART.search(upper) is None:
        return False
    words = name_words(name)
    if not any(_secret_word(w) for w in words):
        return False
    if value is not None and words and words[-1] in POINTER_WORDS and value.startswith(("/", "~")):
        return False
    return True


def is_secret_value(value: str) -> bool:
    """Whether ``value`` carries a credential, whatever its name."""
    return _VALUE_HINT.search(value) is not None and _SECRET_VALUE.search(value) is not None


def is_secret(name: str, value: str | None = None) -> bool:
    """Whether the variable ``name`` (with ``value``, when known) stays out of a command's
    environment unless passed explicitly."""
    if is_secret_name(name, value):
        return True
    return value is not None and is_secret_value(value)


# An executor sees the same environment with every command, and the value patterns cost
# about 10 us a variable: remember the answers for variables of a usual size.
_is_secret_remembered = functools.lru_cache(maxsize=2048)(is_secret)
_REMEMBERED_MAX = 4096


def split_env(env: Mapping[str, str], passthrough: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """``env`` without its secrets, except the names in ``passthrough``; and the names
    dropped, sorted (for telling a person, never with their values)."""
    keep = set(passthrough)
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in env.items():
        secret = (_is_secret_remembered if len(value) <= _REMEMBERED_MAX else is_secret)(name, value)
        if name in keep or not secret:
            kept[name] = value
        else:
            dropped.append(name)
    return kept, sorted(dropped)


def filter_env(env: Mapping[str, str], passthrough: Iterable[str] = ()) -> dict[str, str]:
    """``env`` without secret variables, except the names in ``passthrough``."""
    return split_env(env, passthrough)[0]


def describe_dropped(dropped: Iterable[str], hint: str = "--env NAME passes one through") -> str:
    """One line naming the dropped variables (never their values)."""
    names = sorted(dropped)
    if not names:
        return "no variable dropped as secret"
    return f"{len(names)} variable{'s' if len(names) != 1 else ''} dropped as secret: {', '.join(names)} ({hint})"


# -- Codex's shell_environment_policy ---------------------------------------------------


def _glob(pattern: str) -> re.Pattern[str]:
    # Codex's wildmatch: * is any run of characters, ? one; nothing else is special.
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.IGNORECASE | re.DOTALL)


def _matches_any(name: str, patterns: Iterable[re.Pattern[str]]) -> bool:
    return any(p.fullmatch(name) for p in patterns)


@dataclass(frozen=True)
class CommandEnv:
    """What :meth:`ShellEnvironmentPolicy.apply` made of an environment."""

    env: dict[str, str]
    """The commands' environment."""
    passthrough: list[str]
    """Names in ``env`` that look secret but the policy keeps on purpose (``set``, or
    ``ignore_default_excludes``): the executor lets these through."""
    dropped_secret: list[str]
    """Names dropped as secrets (the default excludes), sorted."""
    left_out: list[str]
    """Names the policy itself left out (inherit, exclude, include_only), sorted."""


@dataclass(frozen=True)
class ShellEnvironmentPolicy:
    """Codex's ``shell_environment_policy``: how the commands' environment is built from
    the caller's. Applied in Codex's order:

    1. ``inherit``: ``all`` of the caller's variables, the ``core`` ones
       (:data:`CORE_VARS`), or ``none``;
    2. unless ``ignore_default_excludes``, drop the secrets (this module's rule, where
       Codex has the globs ``*KEY*``, ``*SECRET*``, ``*TOKEN*``);
    3. drop the names matching an ``exclude`` pattern;
    4. add (or replace) the ``set`` variables;
    5. if ``include_only`` is not empty, keep only the names matching one of its patterns.

    Patterns are globs (``*`` any run of characters, ``?`` one), matched against the
    whole name, case-insensitively, as in Codex.
    """

    inherit: str = "all"
    ignore_default_excludes: bool = False
    exclude: tuple[str, ...] = ()
    set: Mapping[str, str] = field(default_factory=dict)
    include_only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.inherit not in INHERIT_CHOICES:
            raise ValueError(f"inherit must be one of {', '.join(INHERIT_CHOICES)}, got {self.inherit!r}")

    def apply(self, env: Mapping[str, str]) -> CommandEnv:
        if self.inherit == "all":
            result = dict(env)
        elif self.inherit == "core":
            result = {k: v for k, v in env.items() if k in CORE_VARS}
        else:
            result = {}
        left_out = {k for k in env if k not in result}
        dropped: list[str] = []
        if not self.ignore_default_excludes:
            result, dropped = split_env(result)
        if self.exclude:
            excludes = [_glob(p) for p in self.exclude]
            for name in [k for k in result if _matches_any(k, excludes)]:
                del result[name]
                left_out.add(name)
        result.update(self.set)
        if self.include_only:
            includes = [_glob(p) for p in self.include_only]
            for name in [k for k in result if not _matches_any(k, includes)]:
                del result[name]
                if name in env and name not in dropped:
                    left_out.add(name)
        passthrough = sorted(k for k, v in result.items() if is_secret(k, v))
        return CommandEnv(result, passthrough, dropped, sorted(left_out - set(result) - set(dropped)))
