"""The frontends' configuration: ``~/.sluice/config.toml``, profiles, ``-c`` overrides,
model providers. ``sluice exec`` (and ``sluice mcp``, for its policy) read it in their own
process; the agent gets only what they resolved (:mod:`agent.provider`).

The file has Codex's ``config.toml`` shape. ``$SLUICE_HOME`` relocates ``~/.sluice``::

    model = "gpt-5"
    model_provider = "openai"          # a key of [model_providers], built-in or defined here
    approval_policy = "on-request"     # untrusted | on-failure | on-request | never
    sandbox_mode = "workspace-write"   # read-only | workspace-write | danger-full-access
    disable_response_storage = false
    notify = ["notify-send", "sluice"]
    profile = "local"                  # optional: overlay [profiles.local] on the keys above

    [sandbox_workspace_write]
    writable_roots = ["/data"]
    network_access = false

    [model_providers.local]
    name = "llama.cpp on this machine"
    base_url = "http://127.0.0.1:8080/v1"
    env_key = "LOCAL_LLM_KEY"          # optional; no key, no Authorization header
    wire_api = "chat"                  # or "responses"
    query_params = { api-version = "2025-04-01-preview" }
    http_headers = { X-Team = "tools" }
    env_http_headers = { X-Tenant = "LOCAL_LLM_TENANT" }   # header <- environment variable
    request_max_retries = 4            # failed HTTP requests (connect error, 429, 5xx)
    stream_max_retries = 10            # streams that break before the response completes
    stream_idle_timeout_ms = 300000    # silence on an open stream that counts as broken

    [profiles.local]
    model = "qwen3-coder"
    model_provider = "local"

    unified_exec = "seed"              # interactive tools: off | seed | codex (below)
    unified_exec_max_sessions = 64     # live interactive sessions per agent session
    unified_exec_idle_timeout_ms = 1800000   # an unused session is closed after this; 0: never

    [limits]                           # resource limits of every command (docker's spelling)
    memory = "2G"                      # the command's tree; 0: none
    pids = 1024                        # processes and threads at once (or pids-limit)
    file_size = "8G"                   # largest file written (or file-size)
    cpu_time = 600                     # CPU seconds per process (or cpu-time)

    [shell_environment_policy]         # the environment of the agent's commands
    inherit = "all"                    # all | core | none
    ignore_default_excludes = false    # true: keep secret-looking variables too
    exclude = ["AWS_*", "AZURE_*"]     # globs (* and ?), case-insensitive
    set = { CI = "1" }                 # added after the excludes
    include_only = []                  # non-empty: keep only the names matching these

Two providers are built in: ``openai`` (the Responses API at ``$OPENAI_BASE_URL`` or
https://api.openai.com/v1, key in ``$OPENAI_API_KEY``) and ``ollama`` (Chat Completions
at http://localhost:11434/v1, no key). A ``[model_providers.openai]`` or ``ollama``
table in the file changes the fields it names and keeps the rest.

Flag overrides are ``-c key=value`` pairs as Codex takes them: a dotted path into the
file's tables and a TOML value (``-c model_providers.ollama.base_url="http://gpu:11434/v1"``,
``-c request_max_retries=2``); a value that is not valid TOML is taken as a string
(``-c model=o3``). They apply after the file and after the profile.

The frontend resolves the provider with :func:`resolve_provider` in its own process,
against its own environment: the base URL, the headers taken from environment
variables and the API key are fixed there, so a daemon started earlier from another
shell uses the caller's settings. The key travels as a :class:`~agent.provider.Secret`,
which never shows itself in ``repr``, ``str`` or log output.

``unified_exec`` chooses the tools the model gets for long-lived commands (a shell, a
REPL, a dev server): ``off`` offers only ``shell``; ``seed`` (the default) adds the seed's
``unified_exec`` tool beside ``shell``, so a model that knows only ``shell`` loses
nothing; ``codex`` offers Codex's ``exec_command`` and ``write_stdin`` instead of
``shell``, for models trained on them. The frontend sends the three keys with
``configure_session`` (:meth:`Config.unified_exec_settings`).

``shell_environment_policy`` is Codex's: ``sluice exec`` builds its commands'
environment from its own with it (:class:`landlock_helper.env.ShellEnvironmentPolicy`),
the secret rule of :mod:`landlock_helper.env` standing for Codex's default excludes.

Every mistake a person can make here is a :class:`ConfigError` with a one-line message
naming the file (and line, when it is known) or the variable to set.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agent.provider import OPENAI_DEFAULT_BASE_URL, ConfigError, ResolvedProvider, Secret, with_defaults
from broker.cli.base import config_path
from broker.wire.protocol import (
    UNIFIED_EXEC_TOOLS,
    AskForApproval,
    ModelProviderInfo,
    ReasoningEffort,
    ReasoningSummary,
    UnifiedExecSettings,
    WireApi,
    parse_approval_policy,
)
from landlock_helper.env import INHERIT_CHOICES, ShellEnvironmentPolicy
from landlock_helper.limits import LimitError, Limits, from_table
from landlock_helper.policy import MODES, SandboxPolicy

DEFAULT_MODEL = "gpt-5"
DEFAULT_MODEL_PROVIDER = "openai"
DEFAULT_APPROVAL_POLICY = AskForApproval.ON_REQUEST
DEFAULT_SANDBOX_MODE = "read-only"
_UNIFIED_EXEC_DEFAULTS = UnifiedExecSettings()
OLLAMA_DEFAULT_BASE_URL = "http://localhost:11434/v1"


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    return Path(config_path(env))


# -- providers ------------------------------------------------------------------------


def built_in_providers(env: Mapping[str, str] | None = None) -> dict[str, ModelProviderInfo]:
    """The providers every configuration has; ``env`` supplies ``$OPENAI_BASE_URL``."""
    env = os.environ if env is None else env
    openai_base = (env.get("OPENAI_BASE_URL") or "").strip() or OPENAI_DEFAULT_BASE_URL
    return {
        "openai": ModelProviderInfo(
            name="OpenAI",
            base_url=openai_base,
            env_key="OPENAI_API_KEY",
            wire_api=WireApi.RESPONSES,
            env_http_headers={
                "OpenAI-Organization": "OPENAI_ORGANIZATION",
                "OpenAI-Project": "OPENAI_PROJECT",
            },
        ),
        "ollama": ModelProviderInfo(
            name="Ollama",
            base_url=OLLAMA_DEFAULT_BASE_URL,
            wire_api=WireApi.CHAT,
        ),
    }


# -- overrides ------------------------------------------------------------------------


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=VALUE"`` -> ``("a.b", value)``; VALUE is TOML, or else a plain string."""
    key, eq, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not eq or not key:
        raise ConfigError(f"invalid override {text!r}: expected key=value")
    _split_key(key)
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        # Codex's rule: what is not TOML is a string, so -c model=o3 works unquoted.
        value = raw.strip("'\"") if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" else raw
    return key, value


def parse_overrides(texts: Iterable[str]) -> dict[str, Any]:
    """The ``-c`` flags in order, later ones winning."""
    return dict(parse_override(text) for text in texts)


def _split_key(key: str) -> list[str]:
    parts = [part.strip() for part in key.split(".")]
    if not all(parts):
        raise ConfigError(f"invalid override key {key!r}")
    return [part.strip("\"'") for part in parts]


def _apply_overrides(table: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        *parents, last = _split_key(key)
        node = table
        for index, part in enumerate(parents):
            child = node.get(part)
            if not isinstance(child, dict):
                if child is not None:
                    where = ".".join(parents[: index + 1])
                    raise ConfigError(f"invalid override {key!r}: {where} is not a table")
                child = node[part] = {}
            node = child
        node[last] = value


# -- the file -------------------------------------------------------------------------


@dataclass
class Config:
    """The effective configuration: file, then profile, then flag overrides."""

    path: Path | None
    """The file read; None when there was none."""
    model: str = DEFAULT_MODEL
    model_provider: str = DEFAULT_MODEL_PROVIDER
    approval_policy: AskForApproval = DEFAULT_APPROVAL_POLICY
    sandbox_mode: str = DEFAULT_SANDBOX_MODE
    writable_roots: list[str] = field(default_factory=list)
    network_access: bool = False
    disable_response_storage: bool = False
    notify: list[str] | None = None
    instructions: str | None = None
    model_reasoning_effort: str | None = None
    model_reasoning_summary: str | None = None
    hide_agent_reasoning: bool = False
    show_raw_agent_reasoning: bool = False
    profile: str | None = None
    model_providers: dict[str, ModelProviderInfo] = field(default_factory=dict)
    shell_environment_policy: ShellEnvironmentPolicy = field(default_factory=ShellEnvironmentPolicy)
    limits: Limits = field(default_factory=Limits)
    """``[limits]``: the commands' resource limits; unset fields take the executor's defaults."""
    unified_exec: str = _UNIFIED_EXEC_DEFAULTS.tools
    unified_exec_max_sessions: int = _UNIFIED_EXEC_DEFAULTS.max_sessions
    unified_exec_idle_timeout_ms: int = _UNIFIED_EXEC_DEFAULTS.idle_timeout_ms
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    """The effective table, for keys this class does not model."""
    _file_table: dict[str, Any] = field(default_factory=dict, repr=False)
    _text: str = field(default="", repr=False)
    _overrides: dict[str, Any] = field(default_factory=dict, repr=False)
    _env: Mapping[str, str] = field(default_factory=dict, repr=False)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        """This configuration with more flag overrides on top."""
        merged = {**self._overrides, **overrides}
        return _build(self.path, self._text, self._file_table, merged, self._env)

    def unified_exec_settings(self) -> UnifiedExecSettings:
        """The ``unified_exec`` keys as ``configure_session`` carries them."""
        return UnifiedExecSettings(tools=self.unified_exec, max_sessions=self.unified_exec_max_sessions,
                                   idle_timeout_ms=self.unified_exec_idle_timeout_ms)

    def sandbox_policy(self) -> SandboxPolicy:
        try:
            return SandboxPolicy.from_mode(self.sandbox_mode, self.writable_roots, self.network_access)
        except ValueError as err:
            raise ConfigError(f"{self._where('sandbox_workspace_write', 'writable_roots')}: {err}") from None

    def provider(self, name: str | None = None) -> ModelProviderInfo:
        """The provider entry as configured, before anything is read from the environment."""
        name = name or self.model_provider
        try:
            return self.model_providers[name]
        except KeyError:
            known = ", ".join(sorted(self.model_providers))
            where = f"define [model_providers.{name}] in {self.path or default_config_path(self._env)}"
            origin = self._where("model_provider")
            raise ConfigError(f"{origin}: unknown model provider '{name}' (known: {known}); {where}") from None

    def _where(self, *path: str) -> str:
        return _where(self.path, self._text, self._overrides, path)


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Read ``path`` (default ``$SLUICE_HOME/config.toml``; a missing default file means
    all defaults) and apply ``overrides``: a mapping of dotted keys to values, or
    ``-c``-style ``key=value`` strings."""
    env = os.environ if env is None else env
    explicit = path is not None
    file = Path(path) if path is not None else default_config_path(env)
    text = ""
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file not found: {file}") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(f"cannot read {file}: {reason}") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(_toml_error(file, text, err)) from None
    if overrides is None:
        parsed: dict[str, Any] = {}
    elif isinstance(overrides, Mapping):
        parsed = dict(overrides)
    else:
        parsed = parse_overrides(overrides)
    return _build(file if text or explicit else None, text, table, parsed, env)


def _toml_error(file: Path, text: str, err: tomllib.TOMLDecodeError) -> str:
    message = str(err)
    found = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if found:
        reason = message[: found.start()]
        return f"{file}:{found.group(1)}:{found.group(2)}: invalid TOML: {reason}"
    found = re.search(r"\s*\(at end of document\)$", message)
    if found:
        return f"{file}:{text.count(chr(10)) + 1}: invalid TOML at end of file: {message[: found.start()]}"
    return f"{file}: invalid TOML: {message}"


def _build(path: Path | None, text: str, file_table: dict[str, Any], overrides: dict[str, Any], env: Mapping[str, str]) -> Config:
    table = copy.deepcopy(file_table)
    _apply_overrides(table, overrides)
    where = lambda *keys: _where(path, text, overrides, keys)  # noqa: E731

    profile = table.get("profile")
    if profile is not None:
        if not isinstance(profile, str):
            raise ConfigError(f"{where('profile')}: profile must be a string")
        profiles = table.get("profiles") or {}
        chosen = profiles.get(profile) if isinstance(profiles, dict) else None
        if not isinstance(chosen, dict):
            raise ConfigError(f"{where('profile')}: no [profiles.{profile}] table")
        for key, value in chosen.items():
            table[key] = copy.deepcopy(value)
        # Flags beat the profile.
        _apply_overrides(table, {k: v for k, v in overrides.items() if not k.startswith("profiles.")})

    def get(key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = table.get(key, default)
        if value is not default and not isinstance(value, kind):
            expected = {str: "a string", bool: "true or false", int: "an integer"}.get(kind, "a list")  # type: ignore[call-overload]
            raise ConfigError(f"{where(key)}: {key} must be {expected}, got {value!r}")
        return value

    config = Config(path, raw=table, _file_table=file_table, _text=text, _overrides=overrides, _env=env)
    config.profile = profile
    config.model = get("model", str, DEFAULT_MODEL)
    config.model_provider = get("model_provider", str, DEFAULT_MODEL_PROVIDER)
    policy = get("approval_policy", str, None)
    if policy is not None:
        try:
            config.approval_policy = parse_approval_policy(policy)
        except ValueError as err:
            raise ConfigError(f"{where('approval_policy')}: {err}") from None
    config.sandbox_mode = get("sandbox_mode", str, DEFAULT_SANDBOX_MODE)
    if config.sandbox_mode not in MODES:
        choices = ", ".join(MODES)
        raise ConfigError(f"{where('sandbox_mode')}: unknown sandbox mode {config.sandbox_mode!r}; use one of {choices}")
    workspace = table.get("sandbox_workspace_write") or {}
    if not isinstance(workspace, dict):
        raise ConfigError(f"{where('sandbox_workspace_write')}: sandbox_workspace_write must be a table")
    roots = workspace.get("writable_roots", [])
    if not (isinstance(roots, list) and all(isinstance(r, str) for r in roots)):
        raise ConfigError(f"{where('sandbox_workspace_write', 'writable_roots')}: writable_roots must be a list of paths")
    # ~/ is the caller's home directory (docs/sandbox.md's ready list of tools' directories).
    home = env.get("HOME", "")
    config.writable_roots = [home + r[1:] if home and (r == "~" or r.startswith("~/")) else r for r in roots]
    network = workspace.get("network_access", False)
    if not isinstance(network, bool):
        raise ConfigError(f"{where('sandbox_workspace_write', 'network_access')}: network_access must be true or false")
    config.network_access = network
    config.disable_response_storage = get("disable_response_storage", bool, False)
    notify = get("notify", list, None)
    if notify is not None and not all(isinstance(a, str) for a in notify):
        raise ConfigError(f"{where('notify')}: notify must be a list of strings (a program and its arguments)")
    config.notify = notify
    config.instructions = get("instructions", str, None)
    for key, choices in (("model_reasoning_effort", ReasoningEffort), ("model_reasoning_summary", ReasoningSummary)):
        value = get(key, str, None)
        if value is not None and value not in choices.__members__.values():
            allowed = ", ".join(choices)
            raise ConfigError(f"{where(key)}: {key} must be one of {allowed}, got {value!r}")
        setattr(config, key, value)
    config.hide_agent_reasoning = get("hide_agent_reasoning", bool, False)
    config.show_raw_agent_reasoning = get("show_raw_agent_reasoning", bool, False)
    config.model_providers = _providers(table.get("model_providers"), env, where)
    config.shell_environment_policy = _shell_environment_policy(table.get("shell_environment_policy"), where)
    config.unified_exec = get("unified_exec", str, _UNIFIED_EXEC_DEFAULTS.tools)
    if config.unified_exec not in UNIFIED_EXEC_TOOLS:
        raise ConfigError(f"{where('unified_exec')}: unified_exec must be one of {', '.join(UNIFIED_EXEC_TOOLS)}, "
                          f"got {config.unified_exec!r}")
    config.unified_exec_max_sessions = get("unified_exec_max_sessions", int, _UNIFIED_EXEC_DEFAULTS.max_sessions)
    if isinstance(config.unified_exec_max_sessions, bool) or config.unified_exec_max_sessions < 1:
        raise ConfigError(f"{where('unified_exec_max_sessions')}: unified_exec_max_sessions must be a whole "
                          f"number of at least 1, got {config.unified_exec_max_sessions!r}")
    config.unified_exec_idle_timeout_ms = get("unified_exec_idle_timeout_ms", int,
                                              _UNIFIED_EXEC_DEFAULTS.idle_timeout_ms)
    if isinstance(config.unified_exec_idle_timeout_ms, bool) or config.unified_exec_idle_timeout_ms < 0:
        raise ConfigError(f"{where('unified_exec_idle_timeout_ms')}: unified_exec_idle_timeout_ms must be a "
                          f"number of milliseconds >= 0 (0: never), got {config.unified_exec_idle_timeout_ms!r}")
    section = table.get("limits")
    if section is not None:
        try:
            config.limits = from_table(section, "limits")
        except LimitError as err:
            at = ("limits",) if err.key is None else ("limits", err.key)
            raise ConfigError(f"{where(*at)}: {err}") from None
    return config


_POLICY_KEYS = ("inherit", "ignore_default_excludes", "exclude", "set", "include_only", "experimental_use_profile")


def _shell_environment_policy(section: Any, where: Any) -> ShellEnvironmentPolicy:
    """``[shell_environment_policy]``, checked as strictly as the rest: a typo is an error,
    not a policy silently not applied."""
    if section is None:
        return ShellEnvironmentPolicy()
    name = "shell_environment_policy"
    if not isinstance(section, dict):
        raise ConfigError(f"{where(name)}: {name} must be a table")
    for key in section:
        if key not in _POLICY_KEYS:
            raise ConfigError(f"{where(name, key)}: unknown key {name}.{key} (known: {', '.join(_POLICY_KEYS)})")
    inherit = section.get("inherit", "all")
    if inherit not in INHERIT_CHOICES:
        raise ConfigError(f"{where(name, 'inherit')}: {name}.inherit must be one of {', '.join(INHERIT_CHOICES)}, "
                          f"got {inherit!r}")
    for key in ("ignore_default_excludes", "experimental_use_profile"):
        if not isinstance(section.get(key, False), bool):
            raise ConfigError(f"{where(name, key)}: {name}.{key} must be true or false")
    patterns = {}
    for key in ("exclude", "include_only"):
        value = section.get(key, [])
        if not (isinstance(value, list) and all(isinstance(p, str) for p in value)):
            raise ConfigError(f"{where(name, key)}: {name}.{key} must be a list of patterns, e.g. [\"AWS_*\"]")
        patterns[key] = tuple(value)
    variables = section.get("set", {})
    if not isinstance(variables, dict):
        raise ConfigError(f"{where(name, 'set')}: {name}.set must be a table of NAME = \"value\"")
    for key, value in variables.items():
        if not isinstance(value, str):
            raise ConfigError(f"{where(name, 'set', key)}: {name}.set.{key} must be a string, got {value!r}")
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ConfigError(f"{where(name, 'set', key)}: {name}.set: not an environment variable: {key!r}")
    # experimental_use_profile (Codex: run commands through a login shell) is accepted and
    # has no effect: commands run as given.
    return ShellEnvironmentPolicy(
        inherit=inherit,
        ignore_default_excludes=section.get("ignore_default_excludes", False),
        exclude=patterns["exclude"],
        set=dict(variables),
        include_only=patterns["include_only"],
    )


def _providers(section: Any, env: Mapping[str, str], where: Any) -> dict[str, ModelProviderInfo]:
    providers = built_in_providers(env)
    if section is None:
        return providers
    if not isinstance(section, dict):
        raise ConfigError(f"{where('model_providers')}: model_providers must be a table of providers")
    for key, entry in section.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{where('model_providers', key)}: [model_providers.{key}] must be a table")
        base = msgspec.structs.asdict(providers[key]) if key in providers else {"name": key}
        merged = {**{k: v for k, v in base.items() if v is not None}, **entry}
        try:
            info = msgspec.convert(merged, ModelProviderInfo)
        except msgspec.ValidationError as err:
            raise ConfigError(_provider_error(key, err, where)) from None
        for setting in ("request_max_retries", "stream_max_retries", "stream_idle_timeout_ms"):
            value = getattr(info, setting)
            if value is not None and value < 0:
                raise ConfigError(f"{where('model_providers', key, setting)}: {setting} must be >= 0, got {value}")
        if info.stream_idle_timeout_ms == 0:
            raise ConfigError(f"{where('model_providers', key, 'stream_idle_timeout_ms')}: stream_idle_timeout_ms must be > 0")
        providers[key] = info
    return providers


def _provider_error(key: str, err: msgspec.ValidationError, where: Any) -> str:
    message = str(err)
    found = re.search(r" - at `\$\.([A-Za-z_]+)(.*)`$", message)
    if not found:
        return f"{where('model_providers', key)}: [model_providers.{key}]: {message}"
    setting = found.group(1)
    reason = message[: found.start()]
    if setting == "wire_api":
        reason = "wire_api must be \"responses\" or \"chat\""
    origin = where("model_providers", key, setting)
    if origin.startswith("-c "):
        return f"{origin}: {reason}"
    return f"{origin}: model_providers.{key}.{setting}: {reason}"


def _where(path: Path | None, text: str, overrides: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    """Where a setting came from: a -c override, or the file and (best effort) its line."""
    dotted = ".".join(keys)
    for key in overrides:
        if key == dotted or dotted.startswith(key + ".") or key.startswith(dotted + "."):
            return f"-c {key}"
    if path is None:
        return "config"
    line = _find_line(text, keys)
    return f"{path}:{line}" if line else str(path)


def _find_line(text: str, keys: tuple[str, ...]) -> int | None:
    """The line defining ``keys`` (a key under ``[a.b]`` headers or the table itself)."""
    table, key = keys[:-1], keys[-1]
    current: tuple[str, ...] = ()
    header_line = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\](?:\s*#.*)?", stripped)
        if header:
            current = tuple(p.strip().strip("\"'") for p in header.group(1).split("."))
            if current == keys:
                header_line = number
            continue
        assignment = re.match(r"""["']?([A-Za-z0-9_-]+)["']?\s*=""", stripped)
        if assignment and current == table and assignment.group(1) == key:
            return number
    return header_line


# -- the one call a frontend makes ----------------------------------------------------


def resolve_provider(
    name: str | None = None,
    *,
    config: Config | str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> ResolvedProvider:
    """The provider ``name`` (default: the configured ``model_provider``), resolved
    against the CALLER's environment ``env`` (default ``os.environ``).

    ``config`` is a loaded :class:`Config`, or the path of a config file (default
    ``$SLUICE_HOME/config.toml``); ``overrides`` go on top of it. Raises
    :class:`ConfigError` for an unknown provider or a provider whose key variable is
    unset: ``missing API key: set OPENAI_API_KEY``.
    """
    env = os.environ if env is None else env
    if isinstance(config, Config):
        cfg = config.with_overrides(overrides if isinstance(overrides, Mapping) else parse_overrides(overrides or ()))
    else:
        cfg = load_config(config, overrides=overrides, env=env)
    provider_id = name or cfg.model_provider
    info = cfg.provider(provider_id)

    api_key = None
    if info.env_key:
        value = (env.get(info.env_key) or "").strip()
        if not value:
            hint = f" ({info.env_key_instructions})" if info.env_key_instructions else ""
            raise ConfigError(f"missing API key: set {info.env_key}{hint}")
        api_key = Secret(value)

    headers = dict(info.http_headers or {})
    for header, variable in (info.env_http_headers or {}).items():
        value = (env.get(variable) or "").strip()
        if value:
            headers[header] = value
    resolved = msgspec.structs.replace(info, http_headers=headers or None, env_http_headers=None)
    return ResolvedProvider(provider_id, with_defaults(resolved), api_key)
