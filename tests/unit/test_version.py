"""sluice's version: one spelling, and on the wire in a way older peers still decode."""

from __future__ import annotations

import pathlib
import tomllib

import msgspec

from broker.wire import frames as wire
from broker.wire.version import SLUICE_VERSION, version_key

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_package_version_is_the_one_in_the_code() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == SLUICE_VERSION


class _OldWelcome(msgspec.Struct, frozen=True):
    """Welcome as daemons before 0.1.0 sent it (and older clients decode it)."""

    peer_id: str
    version: int = wire.PROTOCOL_VERSION
    heartbeat_s: float = 1.0


class _OldHello(msgspec.Struct, frozen=True):
    role: str
    token: str
    pid: int = 0
    name: str = ""
    slots: int = 0
    version: int = wire.PROTOCOL_VERSION


def test_versions_cross_the_wire_without_breaking_older_peers() -> None:
    new = wire.Welcome(peer_id="frontend-1", sluice_version=SLUICE_VERSION)
    assert msgspec.msgpack.decode(wire.encode(new), type=_OldWelcome) == _OldWelcome(peer_id="frontend-1")
    from_old = wire.decode(wire.WELCOME, msgspec.msgpack.encode(_OldWelcome(peer_id="frontend-1")))
    assert from_old.sluice_version == ""
    hello = wire.decode(wire.HELLO, msgspec.msgpack.encode(_OldHello(role="frontend", token="t")))
    assert hello.sluice_version == ""
    from broker.net.peer import hello as peer_hello

    assert wire.decode(wire.HELLO, peer_hello("frontend", "t", "x")[1]).sluice_version == SLUICE_VERSION


def test_version_order() -> None:
    assert version_key("0.2.0") > version_key("0.1.9") > version_key("0.1") > version_key("")
    assert version_key("1.10.0") > version_key("1.9.3")
    assert version_key("0.2.0rc1") == (0, 2, 0)
