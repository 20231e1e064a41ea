"""config.toml, flag overrides, built-in providers and provider resolution."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from agent.provider import (
    DEFAULT_REQUEST_MAX_RETRIES,
    DEFAULT_STREAM_IDLE_TIMEOUT_MS,
    DEFAULT_STREAM_MAX_RETRIES,
    ResolvedProvider,
    Secret,
)
from broker.cli.config import (
    ConfigError,
    default_config_path,
    load_config,
    parse_override,
    parse_overrides,
    resolve_provider,
)
from broker.wire.protocol import AskForApproval, ModelProviderInfo, WireApi
from landlock_helper.policy import SandboxPermission

pytestmark = pytest.mark.timeout(10)

KEY = "sk-caller-secret-42"

EXAMPLE = """\
model = "o4-mini"
model_provider = "local"
approval_policy = "untrusted"
sandbox_mode = "workspace-write"
disable_response_storage = true
notify = ["notify-send", "sluice"]

[sandbox_workspace_write]
writable_roots = ["/data"]
network_access = true

[model_providers.local]
name = "llama.cpp"
base_url = "http://127.0.0.1:8080/v1"
env_key = "LOCAL_LLM_KEY"
wire_api = "chat"
query_params = { api-version = "1" }
http_headers = { X-Team = "tools" }
env_http_headers = { X-Tenant = "LOCAL_TENANT" }
request_max_retries = 2
stream_max_retries = 3
stream_idle_timeout_ms = 5000

[model_providers.openai]
stream_max_retries = 1

[profiles.fast]
model = "qwen3"
approval_policy = "never"
"""


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A caller environment whose ~/.sluice is under tmp_path."""
    return {"HOME": str(tmp_path)}


def write_config(env: dict[str, str], text: str) -> Path:
    path = default_config_path(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_and_built_ins_without_a_file(home: dict[str, str]) -> None:
    config = load_config(env=home)
    assert config.path is None
    assert config.model_provider == "openai"
    assert config.approval_policy == AskForApproval.ON_REQUEST and config.sandbox_mode == "read-only"
    openai = config.model_providers["openai"]
    assert (openai.base_url, openai.env_key, openai.wire_api) == ("https://api.openai.com/v1", "OPENAI_API_KEY", WireApi.RESPONSES)
    ollama = config.model_providers["ollama"]
    assert (ollama.base_url, ollama.env_key, ollama.wire_api) == ("http://localhost:11434/v1", None, WireApi.CHAT)


def test_openai_from_the_callers_environment(home: dict[str, str]) -> None:
    env = {**home, "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_PROJECT": "proj_1"}
    resolved = resolve_provider(env=env)
    assert resolved.id == "openai" and resolved.wire_api == WireApi.RESPONSES
    assert resolved.base_url == "http://127.0.0.1:9/v1"
    assert resolved.api_key is not None and resolved.api_key.reveal() == KEY
    assert resolved.headers() == {"OpenAI-Project": "proj_1", "Authorization": f"Bearer {KEY}"}
    assert resolved.info.env_http_headers is None  # folded in; the agent reads no environment
    assert (resolved.request_max_retries, resolved.stream_max_retries) == (DEFAULT_REQUEST_MAX_RETRIES, DEFAULT_STREAM_MAX_RETRIES)
    assert (DEFAULT_REQUEST_MAX_RETRIES, DEFAULT_STREAM_MAX_RETRIES) == (4, 10)
    assert resolved.info.stream_idle_timeout_ms == DEFAULT_STREAM_IDLE_TIMEOUT_MS
    assert resolved.stream_idle_timeout == 300.0


def test_ollama_needs_no_key(home: dict[str, str]) -> None:
    resolved = resolve_provider("ollama", env=home)
    assert resolved.api_key is None and "Authorization" not in resolved.headers()
    assert resolved.url("chat/completions") == "http://localhost:11434/v1/chat/completions"


def test_missing_key_names_the_variable(home: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_provider(env={**home, "OPENAI_API_KEY": "  "})
    assert str(caught.value) == "missing API key: set OPENAI_API_KEY"
    write_config(home, '[model_providers.x]\nname = "X"\nbase_url = "http://h/v1"\nenv_key = "X_KEY"\n'
                       'env_key_instructions = "get one at https://x.example/keys"\n')
    with pytest.raises(ConfigError, match=r"^missing API key: set X_KEY \(get one at https://x\.example/keys\)$"):
        resolve_provider("x", env=home)


def test_writable_roots_in_the_home_directory_are_written_with_a_tilde(home: dict[str, str]) -> None:
    write_config(home, '[sandbox_workspace_write]\nwritable_roots = ["~/.npm", "~", "/srv/~x"]\n')
    config = load_config(env=home)
    assert config.writable_roots == [f"{home['HOME']}/.npm", home["HOME"], "/srv/~x"]


def test_config_file(home: dict[str, str]) -> None:
    path = write_config(home, EXAMPLE)
    config = load_config(env=home)
    assert config.path == path
    assert config.model == "o4-mini" and config.model_provider == "local"
    assert config.approval_policy == AskForApproval.UNTRUSTED
    assert config.disable_response_storage is True and config.notify == ["notify-send", "sluice"]
    policy = config.sandbox_policy()
    assert policy.writable_folders == ["/data"] and policy.has_full_network_access()
    assert SandboxPermission.DISK_WRITE_CWD in policy.permissions

    resolved = resolve_provider(config=config, env={**home, "LOCAL_LLM_KEY": KEY, "LOCAL_TENANT": "t1"})
    assert resolved.id == "local" and resolved.name == "llama.cpp" and resolved.wire_api == WireApi.CHAT
    assert resolved.url("chat/completions") == "http://127.0.0.1:8080/v1/chat/completions?api-version=1"
    assert resolved.headers() == {"X-Team": "tools", "X-Tenant": "t1", "Authorization": f"Bearer {KEY}"}
    assert (resolved.request_max_retries, resolved.stream_max_retries, resolved.stream_idle_timeout) == (2, 3, 5.0)

    # A table for a built-in changes only what it names.
    openai = config.model_providers["openai"]
    assert openai.stream_max_retries == 1 and openai.env_key == "OPENAI_API_KEY" and openai.wire_api == WireApi.RESPONSES


def test_sluice_home_relocates_the_file(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "nobody"), "SLUICE_HOME": str(tmp_path / "elsewhere")}
    write_config(env, 'model = "from-sluice-home"\n')
    assert default_config_path(env) == tmp_path / "elsewhere" / "config.toml"
    assert load_config(env=env).model == "from-sluice-home"


def test_explicit_path(tmp_path: Path, home: dict[str, str]) -> None:
    path = tmp_path / "other.toml"
    path.write_text('model = "o3"\n')
    assert load_config(path, env=home).model == "o3"
    with pytest.raises(ConfigError, match=r"^config file not found: .*missing\.toml$"):
        load_config(tmp_path / "missing.toml", env=home)


def test_profile_overlays_the_top_level(home: dict[str, str]) -> None:
    write_config(home, 'profile = "fast"\n' + EXAMPLE)
    config = load_config(env=home)
    assert config.profile == "fast" and config.model == "qwen3" and config.approval_policy == AskForApproval.NEVER
    assert config.model_provider == "local"  # not in the profile: the top level's
    # Flags beat the profile.
    assert load_config(env=home, overrides={"model": "flagged"}).model == "flagged"
    with pytest.raises(ConfigError, match=r"no \[profiles\.nope\] table"):
        load_config(env=home, overrides={"profile": "nope"})


def test_overrides_parse_as_toml_or_strings() -> None:
    assert parse_override("model=o3") == ("model", "o3")
    assert parse_override("model = 'o3'") == ("model", "o3")
    assert parse_override("a.b.request_max_retries=2") == ("a.b.request_max_retries", 2)
    assert parse_override("disable_response_storage=true") == ("disable_response_storage", True)
    assert parse_override("notify=['say', 'done']") == ("notify", ["say", "done"])
    assert parse_override('x.http_headers={ A = "b" }') == ("x.http_headers", {"A": "b"})
    assert parse_override("instructions=hello world") == ("instructions", "hello world")
    for bad in ("model", "=x", "a..b=1"):
        with pytest.raises(ConfigError):
            parse_override(bad)
    assert parse_overrides(["model=a", "model=b"]) == {"model": "b"}


def test_overrides_beat_the_file(home: dict[str, str]) -> None:
    write_config(home, EXAMPLE)
    flags = [
        "model_provider=ollama",
        'model_providers.ollama.base_url="http://gpu:11434/v1"',
        "model_providers.ollama.request_max_retries=1",
        "model_providers.new.base_url=http://new/v1",
        "sandbox_mode=read-only",
    ]
    config = load_config(env=home, overrides=flags)
    assert config.model_provider == "ollama" and config.sandbox_mode == "read-only"
    assert config.model_providers["new"].name == "new"  # named after its key when unnamed
    resolved = resolve_provider(config=config, env=home)
    assert resolved.id == "ollama" and resolved.base_url == "http://gpu:11434/v1"
    assert resolved.request_max_retries == 1 and resolved.wire_api == WireApi.CHAT

    # resolve_provider takes the same overrides directly, as a mapping.
    resolved = resolve_provider(env={**home, "LOCAL_LLM_KEY": KEY},
                                overrides={"model_providers.local.stream_idle_timeout_ms": 250})
    assert resolved.id == "local" and resolved.stream_idle_timeout == 0.25


def test_bad_toml_is_one_line_naming_file_and_line(home: dict[str, str]) -> None:
    path = write_config(home, 'model = "o3"\n\n[model_providers.x]\nbase_url = \n')
    with pytest.raises(ConfigError) as caught:
        load_config(env=home)
    message = str(caught.value)
    assert message.startswith(f"{path}:4:") and "invalid TOML" in message and "\n" not in message


def test_unknown_provider(home: dict[str, str]) -> None:
    path = write_config(home, 'model = "m"\nmodel_provider = "nowhere"\n')
    with pytest.raises(ConfigError) as caught:
        resolve_provider(env=home)
    assert str(caught.value) == (f"{path}:2: unknown model provider 'nowhere' (known: ollama, openai); "
                                 f"define [model_providers.nowhere] in {path}")
    with pytest.raises(ConfigError, match=r"^-c model_provider: unknown model provider 'gone'"):
        resolve_provider(env=home, overrides={"model_provider": "gone"})
    with pytest.raises(ConfigError, match=r"unknown model provider 'other'"):
        resolve_provider("other", env=home)


@pytest.mark.parametrize(("text", "expected"), [
    ('[model_providers.x]\nname = "X"\nwire_api = "grpc"\n',
     r':3: model_providers\.x\.wire_api: wire_api must be "responses" or "chat"$'),
    ('[model_providers.x]\nname = "X"\nrequest_max_retries = "many"\n',
     r":3: model_providers\.x\.request_max_retries: Expected `int \| null`, got `str`$"),
    ('[model_providers.x]\nname = "X"\nstream_max_retries = -1\n', r":3: stream_max_retries must be >= 0, got -1$"),
    ('approval_policy = "sometimes"\n', r":1: approval policy 'sometimes' is unknown; use one of "),
    ('sandbox_mode = "open"\n', r":1: unknown sandbox mode 'open'"),
    ('model = 3\n', r":1: model must be a string, got 3$"),
    ('model_providers = 1\n', r":1: model_providers must be a table"),
])
def test_invalid_values_name_the_line(home: dict[str, str], text: str, expected: str) -> None:
    path = write_config(home, text)
    with pytest.raises(ConfigError) as caught:
        load_config(env=home)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)
    assert re.search(expected, str(caught.value)), str(caught.value)


def test_old_approval_policy_name(home: dict[str, str]) -> None:
    write_config(home, 'approval_policy = "unless-allow-listed"\n')
    assert load_config(env=home).approval_policy == AskForApproval.UNTRUSTED


def test_retry_settings_are_capped(home: dict[str, str]) -> None:
    resolved = resolve_provider("ollama", env=home, overrides={"model_providers.ollama.stream_max_retries": 1000})
    assert resolved.stream_max_retries == 100 and resolved.info.stream_max_retries == 100


def test_the_key_never_shows(home: dict[str, str]) -> None:
    resolved = resolve_provider(env={**home, "OPENAI_API_KEY": KEY})
    texts = [repr(resolved), str(resolved), repr(resolved.api_key), str(resolved.api_key), repr(resolved.info),
             msgspec.json.encode(resolved.info).decode(), f"{resolved}", f"{resolved.api_key!s}"]
    for text in texts:
        assert KEY not in text
    assert "api_key=<set>" in repr(resolved)
    assert Secret(KEY) == resolved.api_key


def test_from_info_fills_defaults() -> None:
    resolved = ResolvedProvider.from_info(ModelProviderInfo(name="p", base_url="http://h/v1/"), "k")
    assert resolved.info.request_max_retries == 4 and resolved.info.stream_max_retries == 10
    assert resolved.url("/responses") == "http://h/v1/responses"
    with pytest.raises(ConfigError, match="has no base_url"):
        ResolvedProvider.from_info(ModelProviderInfo(name="p"))


# -- shell_environment_policy ------------------------------------------------------------


def test_shell_environment_policy_from_the_file_and_overrides(home: dict[str, str]) -> None:
    from landlock_helper.env import ShellEnvironmentPolicy

    assert load_config(env=home).shell_environment_policy == ShellEnvironmentPolicy()
    write_config(home, '[shell_environment_policy]\ninherit = "core"\nignore_default_excludes = true\n'
                       'exclude = ["AWS_*"]\nset = { CI = "1" }\ninclude_only = ["PATH", "CI"]\n'
                       'experimental_use_profile = false\n')
    policy = load_config(env=home).shell_environment_policy
    assert policy == ShellEnvironmentPolicy(inherit="core", ignore_default_excludes=True, exclude=("AWS_*",),
                                            set={"CI": "1"}, include_only=("PATH", "CI"))
    over = load_config(env=home, overrides=[
        "shell_environment_policy.inherit=none", "shell_environment_policy.set.EXTRA=x",
        'shell_environment_policy.include_only=[]']).shell_environment_policy
    assert over.inherit == "none" and over.set == {"CI": "1", "EXTRA": "x"} and over.include_only == ()
    assert over.exclude == ("AWS_*",) and over.ignore_default_excludes is True
    # A profile may carry one too, as any other key.
    write_config(home, 'profile = "p"\n[profiles.p.shell_environment_policy]\ninherit = "core"\n')
    assert load_config(env=home).shell_environment_policy.inherit == "core"


@pytest.mark.parametrize(("text", "expected"), [
    ('[shell_environment_policy]\ninherit = "most"\n',
     r":2: shell_environment_policy\.inherit must be one of all, core, none, got 'most'$"),
    ('[shell_environment_policy]\nexlude = ["A*"]\n', r":2: unknown key shell_environment_policy\.exlude \(known: "),
    ('[shell_environment_policy]\nexclude = "AWS_*"\n', r":2: shell_environment_policy\.exclude must be a list of patterns"),
    ('[shell_environment_policy]\nignore_default_excludes = "yes"\n',
     r":2: shell_environment_policy\.ignore_default_excludes must be true or false$"),
    ('[shell_environment_policy]\nset = { RETRIES = 3 }\n', r"shell_environment_policy\.set\.RETRIES must be a string, got 3$"),
    ('shell_environment_policy = "all"\n', r":1: shell_environment_policy must be a table$"),
])
def test_shell_environment_policy_mistakes_are_one_line(home: dict[str, str], text: str, expected: str) -> None:
    path = write_config(home, text)
    with pytest.raises(ConfigError) as caught:
        load_config(env=home)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)
    assert re.search(expected, str(caught.value)), str(caught.value)


def test_shell_environment_policy_override_mistake_names_the_flag(home: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"^-c shell_environment_policy\.inherit: .*got 'some'$"):
        load_config(env=home, overrides=["shell_environment_policy.inherit=some"])
