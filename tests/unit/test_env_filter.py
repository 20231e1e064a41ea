"""The secret rule of landlock_helper.env, and shell_environment_policy: no processes."""

from __future__ import annotations

import pytest

from landlock_helper.env import (
    CORE_VARS,
    ShellEnvironmentPolicy,
    describe_dropped,
    filter_env,
    is_secret,
    is_secret_name,
    is_secret_value,
    name_words,
    split_env,
)

# (name, value, dropped?) -- real-world names, both ways. The value is a typical one;
# "x" where only the name matters.
SECRET = True
KEPT = False
CASES = [
    # Cloud and service credentials
    ("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE", SECRET),
    ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", SECRET),
    ("AWS_SESSION_TOKEN", "x", SECRET),
    ("AWS_REGION", "eu-west-1", KEPT),
    ("AWS_PROFILE", "dev", KEPT),
    ("AWS_SHARED_CREDENTIALS_FILE", "/home/u/.aws/credentials", KEPT),   # a path to a secret, not one
    ("AWS_SHARED_CREDENTIALS_FILE", "inline-not-a-path", SECRET),       # not a path: the name decides
    ("GITHUB_TOKEN", "ghp_0123456789abcdefghijklmnopqrstuvwxyz", SECRET),
    ("GH_TOKEN", "x", SECRET),
    ("GH_PAT", "x", SECRET),
    ("GITHUB_PAT", "x", SECRET),
    ("AZURE_DEVOPS_EXT_PAT", "x", SECRET),
    ("GITLAB_PRIVATE_TOKEN", "x", SECRET),
    ("CI_JOB_TOKEN", "x", SECRET),
    ("CI_JOB_JWT", "x", SECRET),
    ("CI_JOB_JWT_V2", "x", SECRET),
    ("NPM_TOKEN", "x", SECRET),
    ("NODE_AUTH_TOKEN", "x", SECRET),
    ("npm_config__authToken", "x", SECRET),           # camelCase: auth, Token
    ("NPM_CONFIG__AUTH", "x", SECRET),
    ("OPENAI_API_KEY", "sk-proj-abc", SECRET),
    ("ANTHROPIC_API_KEY", "sk-ant-abc", SECRET),
    ("OPENAIAPIKEY", "x", SECRET),                    # one word ending in a key compound
    ("HF_TOKEN", "x", SECRET),
    ("HUGGING_FACE_HUB_TOKEN", "x", SECRET),
    ("PGPASSWORD", "x", SECRET),                      # one word containing PASSWORD
    ("POSTGRES_PASSWORD", "x", SECRET),
    ("MYSQL_PWD", "x", SECRET),
    ("MYSQL_ROOT_PASSWORD", "x", SECRET),
    ("DB_PASS", "x", SECRET),
    ("SMTP_PASS", "x", SECRET),
    ("REDIS_PASSWD", "x", SECRET),
    ("SSH_PASSPHRASE", "x", SECRET),
    ("DOCKER_AUTH_CONFIG", '{"auths":{}}', SECRET),
    ("DOCKER_PASSWORD", "x", SECRET),
    ("REGISTRY_AUTH", "x", SECRET),
    ("HTTP_AUTHORIZATION", "Bearer x", SECRET),
    ("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/XXXX", SECRET),
    ("DISCORD_WEBHOOK", "x", SECRET),
    ("SENTRY_DSN", "https://abc@o0.ingest.sentry.io/1", SECRET),
    ("DJANGO_SECRET_KEY", "x", SECRET),
    ("CLIENTSECRET", "x", SECRET),
    ("AZURE_CLIENT_SECRET", "x", SECRET),
    ("GOOGLE_APPLICATION_CREDENTIALS", "/home/u/key.json", SECRET),   # borderline: --env passes it
    ("GCP_CREDS", "x", SECRET),
    ("SESSION_COOKIE", "x", SECRET),
    ("STRIPE_PRIVATE_KEY", "x", SECRET),
    ("GPG_KEY", "A035C8C19219BA821ECEA86B64E628F8D684696D", SECRET),  # borderline: a public fingerprint
    ("VAULT_TOKEN", "x", SECRET),
    ("TWILIO_AUTH_TOKEN", "x", SECRET),
    ("API_KEYS", "a,b", SECRET),
    ("MFA_OTP", "123456", SECRET),
    ("my_service_api_key", "x", SECRET),              # lower case too
    # Credentials in values, under harmless names
    ("DATABASE_URL", "postgres://app:s3cret@db.internal:5432/app", SECRET),
    ("DATABASE_URL", "postgres://localhost/app", KEPT),                 # no password: harmless
    ("DATABASE_URL", "sqlite:///app.db", KEPT),
    ("DATABASE_URL", "jdbc:mysql://db/app?user=app&password=s3cret", SECRET),
    ("REDIS_URL", "redis://:s3cret@cache:6379/0", SECRET),
    ("REDIS_URL", "redis://cache:6379/0", KEPT),
    ("HTTPS_PROXY", "http://user:pass@proxy.corp:3128", SECRET),
    ("https_proxy", "http://proxy.corp:3128", KEPT),
    ("ALL_PROXY", "socks5://alice:pw@10.0.0.1:1080", SECRET),
    ("NO_PROXY", "localhost,127.0.0.1,.corp", KEPT),
    ("PG_CONN", "host=db user=app password=s3cret dbname=app", SECRET),
    ("CONN_STR", "Server=db;Database=app;Uid=app;Pwd=s3cret;", SECRET),
    ("REPO_REMOTE", "https://ghp_0123456789abcdefghijklmnopqrstuvwxyz@github.com/o/r.git", SECRET),
    ("GIT_REMOTE", "ssh://git@github.com/o/r.git", KEPT),              # a user, no password
    ("UPSTREAM", "https://alice@example.com/o/r.git", KEPT),
    ("SOME_HEADER", "Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345", SECRET),
    ("GH", "ghp_0123456789abcdefghijklmnopqrstuvwxyz", SECRET),
    ("CURL_AUTH_HEADER_VALUE", "x", SECRET),
    ("EXTRA_HEADER", "Basic dXNlcjpwYXNzd29yZDEyMw==", SECRET),
    ("DESCRIPTION", "a basic configuration-management-tool", KEPT),
    ("MOTTO", "bearer of good-news-and-better-tidings", KEPT),
    ("BOT", "xoxb-1234567890-abcdefghij", SECRET),
    ("KEY_MATERIAL_PEM", "-----BEGIN RSA PRIVATE KEY-----\nMII...", SECRET),
    ("ID", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig", SECRET),
    ("LEGACY_ID", "AKIAIOSFODNN7EXAMPLE", SECRET),
    # Handles that reach outside the sandbox
    ("SSH_AUTH_SOCK", "/run/user/1000/ssh-agent.sock", SECRET),
    ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1000/bus", SECRET),
    ("GPG_AGENT_INFO", "/run/user/1000/gnupg/S.gpg-agent:0:1", SECRET),
    ("SESSION_MANAGER", "local/host:@/tmp/.ICE-unix/1234,unix/host:/tmp/.ICE-unix/1234", SECRET),
    ("SLUICE_RUNTIME_DIR", "/run/user/1000/sluice", SECRET),
    # Harmless names that the old substring rule dropped
    ("GIT_AUTHOR_NAME", "Ada Lovelace", KEPT),
    ("GIT_AUTHOR_EMAIL", "ada@example.com", KEPT),
    ("GIT_COMMITTER_NAME", "Ada Lovelace", KEPT),
    ("GIT_COMMITTER_EMAIL", "ada@example.com", KEPT),
    ("XDG_SESSION_TYPE", "wayland", KEPT),
    ("XDG_SESSION_ID", "2", KEPT),
    ("XDG_SESSION_CLASS", "user", KEPT),
    ("XDG_SESSION_DESKTOP", "gnome", KEPT),
    ("DESKTOP_SESSION", "ubuntu", KEPT),
    ("GDMSESSION", "ubuntu", KEPT),
    ("TOKENIZERS_PARALLELISM", "false", KEPT),
    ("MAX_TOKENS", "4096", KEPT),                                   # TOKENS: a count
    ("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "8192", KEPT),
    ("KEYBOARD", "us", KEPT),
    ("XKB_DEFAULT_LAYOUT", "us", KEPT),
    ("MONKEY", "banana", KEPT),
    ("TURKEY", "x", KEPT),
    ("AUTHOR", "ada", KEPT),
    ("XAUTHORITY", "/run/user/1000/gdm/Xauthority", KEPT),
    ("PATTERN", "*.py", KEPT),
    ("BYPASS_CACHE", "1", KEPT),
    ("COMPASS_HOME", "/opt/compass", KEPT),
    ("PASSWORD_STORE_DIR", "/home/u/.password-store", KEPT),        # a path: points at secrets
    ("SSH_KEY_PATH", "~/.ssh/id_ed25519", KEPT),
    ("KUBECONFIG", "/home/u/.kube/config", KEPT),                   # a path; no secret word
    ("DOCKER_HOST", "unix:///run/user/1000/docker.sock", KEPT),
    ("DOCKER_CONFIG", "/home/u/.docker", KEPT),
    # The everyday environment
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/bin:/bin", KEPT),
    ("PATH", "/opt/sk-learn-tools-and-more-stuff-0123456789abcdef/bin:/usr/bin", KEPT),
    ("HOME", "/home/u", KEPT),
    ("USER", "u", KEPT),
    ("LOGNAME", "u", KEPT),
    ("SHELL", "/bin/bash", KEPT),
    ("LANG", "en_US.UTF-8", KEPT),
    ("LC_ALL", "C.UTF-8", KEPT),
    ("TERM", "xterm-256color", KEPT),
    ("PWD", "/home/u/src", KEPT),
    ("OLDPWD", "/home/u", KEPT),
    ("TMPDIR", "/tmp", KEPT),
    ("EDITOR", "vim", KEPT),
    ("PAGER", "less", KEPT),
    ("DISPLAY", ":0", KEPT),
    ("WAYLAND_DISPLAY", "wayland-0", KEPT),
    ("VIRTUAL_ENV", "/home/u/.venv", KEPT),
    ("PYTHONPATH", "/src", KEPT),
    ("GOPATH", "/home/u/go", KEPT),
    ("CARGO_HOME", "/home/u/.cargo", KEPT),
    ("NODE_ENV", "development", KEPT),
    ("CI", "true", KEPT),
    ("GITHUB_ACTIONS", "true", KEPT),
    ("GITHUB_REPOSITORY", "o/r", KEPT),
    ("LS_COLORS", "rs=0:di=01;34:ln=01;36:*.tar=01;31:*.pass=00;90", KEPT),
    ("LESSOPEN", "| /usr/bin/lesspipe %s", KEPT),
    ("HISTCONTROL", "ignoreboth", KEPT),
    ("TMUX_PANE", "%3", KEPT),
    ("COLORTERM", "truecolor", KEPT),
]


@pytest.mark.parametrize(("name", "value", "secret"), CASES, ids=[f"{n}={'secret' if s else 'kept'}" for n, _, s in CASES])
def test_secret_rule(name: str, value: str, secret: bool) -> None:
    assert is_secret(name, value) is secret
    env = {name: value}
    assert (filter_env(env) == {}) is secret
    # A name passed explicitly is kept whatever it looks like.
    assert filter_env(env, [name]) == env


@pytest.mark.parametrize(("name", "words"), [
    ("GH_PAT", ["GH", "PAT"]),
    ("npm_config__authToken", ["NPM", "CONFIG", "AUTH", "TOKEN"]),
    ("GHToken", ["GH", "TOKEN"]),
    ("CI_JOB_JWT_V2", ["CI", "JOB", "JWT", "V", "2"]),
    ("npm_config_//registry.npmjs.org/:_authToken", ["NPM", "CONFIG", "REGISTRY", "NPMJS", "ORG", "AUTH", "TOKEN"]),
])
def test_name_words(name: str, words: list[str]) -> None:
    assert name_words(name) == words


def test_name_rule_alone_and_value_rule_alone() -> None:
    assert is_secret_name("DATABASE_URL") is False
    assert is_secret_value("postgres://u:pw@h/db") is True
    assert is_secret_name("PASSWORD_STORE_DIR") is True          # no value: the name decides
    assert is_secret_name("PASSWORD_STORE_DIR", "/home/u/.password-store") is False
    assert is_secret("GITHUB_TOKEN") is True


def test_split_env_reports_names_not_values() -> None:
    env = {"PATH": "/bin", "GH_PAT": "ghp-value", "DB_PASS": "pw-value", "LANG": "C"}
    kept, dropped = split_env(env, ["DB_PASS"])
    assert kept == {"PATH": "/bin", "DB_PASS": "pw-value", "LANG": "C"}
    assert dropped == ["GH_PAT"]
    line = describe_dropped(split_env(env)[1])
    assert line == "2 variables dropped as secret: DB_PASS, GH_PAT (--env NAME passes one through)"
    assert "value" not in line
    assert describe_dropped([]) == "no variable dropped as secret"


# -- shell_environment_policy, Codex's order ---------------------------------------------

CALLER = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/u",
    "USER": "u",
    "TMPDIR": "/tmp/u",
    "LANG": "C.UTF-8",
    "GIT_AUTHOR_NAME": "Ada",
    "OPENAI_API_KEY": "sk-x",
    "GH_PAT": "p",
    "AWS_REGION": "eu-west-1",
    "AWS_SECRET_ACCESS_KEY": "s",
    "MONKEY": "banana",
}


def test_default_policy_is_inherit_all_minus_secrets() -> None:
    out = ShellEnvironmentPolicy().apply(CALLER)
    assert out.env == {k: v for k, v in CALLER.items() if k not in ("OPENAI_API_KEY", "GH_PAT", "AWS_SECRET_ACCESS_KEY")}
    assert out.dropped_secret == ["AWS_SECRET_ACCESS_KEY", "GH_PAT", "OPENAI_API_KEY"]
    assert out.left_out == [] and out.passthrough == []


def test_inherit_core_and_none() -> None:
    out = ShellEnvironmentPolicy(inherit="core").apply(CALLER)
    assert out.env == {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "USER": "u", "TMPDIR": "/tmp/u"}
    assert set(out.env) <= set(CORE_VARS)
    assert "LANG" in out.left_out and "GH_PAT" in out.left_out
    out = ShellEnvironmentPolicy(inherit="none", set={"FOO": "bar"}).apply(CALLER)
    assert out.env == {"FOO": "bar"}
    with pytest.raises(ValueError, match="inherit must be one of all, core, none"):
        ShellEnvironmentPolicy(inherit="most")


def test_exclude_globs_are_case_insensitive() -> None:
    out = ShellEnvironmentPolicy(exclude=("aws_*", "?ANG")).apply(CALLER)
    assert "AWS_REGION" not in out.env and "LANG" not in out.env
    assert out.left_out == ["AWS_REGION", "LANG"]
    assert out.dropped_secret == ["AWS_SECRET_ACCESS_KEY", "GH_PAT", "OPENAI_API_KEY"]
    # Only * and ? are special: brackets and dots are themselves.
    out = ShellEnvironmentPolicy(exclude=("[A]*", "PAT.")).apply({"A": "1", "[A]B": "2", "PATH": "3"})
    assert out.env == {"A": "1", "PATH": "3"}


def test_ignore_default_excludes_keeps_secrets_and_passes_them_through() -> None:
    out = ShellEnvironmentPolicy(ignore_default_excludes=True).apply(CALLER)
    assert out.env == CALLER
    assert out.passthrough == ["AWS_SECRET_ACCESS_KEY", "GH_PAT", "OPENAI_API_KEY"]
    assert out.dropped_secret == []


def test_set_comes_after_the_excludes_and_before_include_only() -> None:
    policy = ShellEnvironmentPolicy(exclude=("FOO",), set={"FOO": "set", "DEPLOY_TOKEN": "t", "BAR": "b"},
                                    include_only=("PATH", "foo", "*_token"))
    out = policy.apply(dict(CALLER, FOO="caller"))
    # exclude dropped the caller's FOO, set put one back; include_only dropped BAR (set,
    # not included) and everything else but PATH.
    assert out.env == {"PATH": "/usr/bin:/bin", "FOO": "set", "DEPLOY_TOKEN": "t"}
    # A secret-looking name the user set on purpose goes through the executor's filter.
    assert out.passthrough == ["DEPLOY_TOKEN"]
    assert "HOME" in out.left_out and "GH_PAT" not in out.left_out and "GH_PAT" in out.dropped_secret


def test_include_only_alone() -> None:
    out = ShellEnvironmentPolicy(include_only=("PATH", "HOME", "GH_*")).apply(CALLER)
    assert out.env == {"PATH": "/usr/bin:/bin", "HOME": "/home/u"}   # GH_PAT went with the secrets


# -- the log redaction uses the same rule ------------------------------------------------


def test_log_redaction_uses_the_same_rule() -> None:
    import io
    import json

    import structlog

    from broker.net.logging import configure

    saved = structlog.get_config()
    stream = io.StringIO()
    configure(json=True, level="info", stream=stream)
    try:
        structlog.get_logger("t").info(
            "probe", token="t0k3n", api_key="k", gh_pat="p", error="cannot reach postgres://u:pw@db/x",
            key="PUBLICKEYZ85", tokenizers_parallelism="false", author="ada", path="/tmp/x")
    finally:
        structlog.configure(**saved)
    record = json.loads(stream.getvalue())
    for field in ("token", "api_key", "gh_pat", "error"):
        assert record[field] == "[redacted]", field
    assert record["key"] == "PUBLICKEYZ85"        # CurveZMQ public keys are logged on purpose
    assert record["tokenizers_parallelism"] == "false" and record["author"] == "ada" and record["path"] == "/tmp/x"


def test_configure_session_env_is_sluices_own_optional_field() -> None:
    from broker.wire.protocol import (
        ConfigureSession,
        ModelProviderInfo,
        Submission,
        decode_submission_json,
        encode_json,
    )
    from landlock_helper.policy import SandboxPolicy

    base = dict(provider=ModelProviderInfo(name="p", base_url="http://127.0.0.1:9/v1"), model="m",
                approval_policy="never", sandbox_policy=SandboxPolicy.from_mode("read-only"), cwd="/tmp")
    plain = encode_json(Submission(id="1", op=ConfigureSession(**base)))
    assert b'"env"' not in plain                         # Codex's shape when unset
    op = ConfigureSession(**base, env={"PATH": "/bin", "DEPLOY_TOKEN": "t-value"}, env_passthrough=["DEPLOY_TOKEN"])
    assert "t-value" not in repr(op) and "env=<2 variables>" in repr(op)
    again = decode_submission_json(encode_json(Submission(id="1", op=op))).op
    assert again.env == op.env and again.env_passthrough == ["DEPLOY_TOKEN"]
