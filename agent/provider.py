"""The model provider as the agent uses it: every setting resolved, the key kept secret.

The frontend resolves a provider in its own process, against its own environment
(:func:`broker.cli.config.resolve_provider`: ``config.toml``, profiles, ``-c`` overrides)
and sends it with ``configure_session``; the agent turns what came into a
:class:`ResolvedProvider` (:meth:`ResolvedProvider.from_info`). The key travels as a
:class:`Secret`, which never shows itself in ``repr``, ``str`` or log output.
"""

from __future__ import annotations

from urllib.parse import urlencode

import msgspec

from broker.wire.protocol import ModelProviderInfo, WireApi

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"

# Codex's defaults and ceilings for the per-provider retry settings.
DEFAULT_REQUEST_MAX_RETRIES = 4
DEFAULT_STREAM_MAX_RETRIES = 10
DEFAULT_STREAM_IDLE_TIMEOUT_MS = 300_000
MAX_RETRIES_CEILING = 100


class ConfigError(Exception):
    """A configuration mistake; ``str()`` is one line saying what is wrong and where."""


class Secret:
    """A string that does not show itself: ``repr`` and ``str`` say ``'********'``.

    ``reveal()`` gives the value, for the one place that needs it (the HTTP header).
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class ResolvedProvider:
    """A provider ready to use: every default filled in, headers and key read from the
    caller's environment.

    ``info`` is self-contained (``env_http_headers`` already folded into
    ``http_headers``, the retry settings set) and safe to send and to record; the key
    is kept apart as a :class:`Secret` and is never part of ``info``, ``repr`` or ``str``.
    """

    __slots__ = ("id", "info", "api_key")

    def __init__(self, id: str, info: ModelProviderInfo, api_key: Secret | str | None = None) -> None:
        if not info.base_url:
            raise ConfigError(f"model provider '{id}' has no base_url")
        self.id = id
        self.info = info
        self.api_key = Secret(api_key) if isinstance(api_key, str) else api_key

    @classmethod
    def from_info(cls, info: ModelProviderInfo, api_key: Secret | str | None = None, *, id: str | None = None) -> ResolvedProvider:
        """The receiving side: an already-resolved provider (from ``configure_session``)
        plus the key that came with it; any unset retry setting gets its default."""
        return cls(id or info.name, with_defaults(info), api_key)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def base_url(self) -> str:
        assert self.info.base_url is not None
        return self.info.base_url.rstrip("/")

    @property
    def wire_api(self) -> WireApi:
        return WireApi(self.info.wire_api)

    @property
    def request_max_retries(self) -> int:
        return effective_retries(self.info.request_max_retries, DEFAULT_REQUEST_MAX_RETRIES)

    @property
    def stream_max_retries(self) -> int:
        return effective_retries(self.info.stream_max_retries, DEFAULT_STREAM_MAX_RETRIES)

    @property
    def stream_idle_timeout(self) -> float:
        """Seconds."""
        ms = self.info.stream_idle_timeout_ms
        return (DEFAULT_STREAM_IDLE_TIMEOUT_MS if ms is None else ms) / 1000.0

    def url(self, path: str) -> str:
        """``{base_url}/{path}`` plus the provider's query parameters."""
        url = f"{self.base_url}/{path.lstrip('/')}"
        if self.info.query_params:
            url += ("&" if "?" in url else "?") + urlencode(self.info.query_params)
        return url

    def headers(self) -> dict[str, str]:
        """The provider's own headers plus ``Authorization`` when there is a key."""
        headers = dict(self.info.http_headers or {})
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key.reveal()}"
        return headers

    def __repr__(self) -> str:
        key = "set" if self.api_key is not None else "none"
        return (
            f"ResolvedProvider(id={self.id!r}, name={self.name!r}, base_url={self.info.base_url!r}, "
            f"wire_api={str(self.info.wire_api)!r}, api_key=<{key}>)"
        )

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ResolvedProvider)
            and (self.id, self.info, self.api_key) == (other.id, other.info, other.api_key)
        )

    __hash__ = None  # type: ignore[assignment]


def effective_retries(value: int | None, default: int) -> int:
    return min(default if value is None else value, MAX_RETRIES_CEILING)


def with_defaults(info: ModelProviderInfo) -> ModelProviderInfo:
    return msgspec.structs.replace(
        info,
        request_max_retries=effective_retries(info.request_max_retries, DEFAULT_REQUEST_MAX_RETRIES),
        stream_max_retries=effective_retries(info.stream_max_retries, DEFAULT_STREAM_MAX_RETRIES),
        stream_idle_timeout_ms=(
            DEFAULT_STREAM_IDLE_TIMEOUT_MS if info.stream_idle_timeout_ms is None else info.stream_idle_timeout_ms
        ),
    )
