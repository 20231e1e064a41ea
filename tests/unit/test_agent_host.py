"""The agent process's session host without a daemon: the outbox, inbox order, interrupts first."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from agent.host import Outbox, SessionHost
from broker.wire import frames as wire
from broker.wire.protocol import (
    AgentMessageDeltaEvent,
    AskForApproval,
    ConfigureSession,
    Event,
    ExecCommandOutputDeltaEvent,
    ExecOutputStream,
    Interrupt,
    ModelProviderInfo,
    Shutdown,
    Submission,
    TextInput,
    UserInput,
    decode_event_msgpack,
    encode_msgpack,
)
from landlock_helper.policy import SandboxPolicy

pytestmark = pytest.mark.timeout(10)


class FakeLink:
    """Takes what is sent unless ``full``; ``handlers`` as PeerLink.on registers them."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.full = False
        self.broken = None
        self.handlers: dict = {}

    def on(self, kind, handler) -> None:
        self.handlers[kind] = handler

    def send(self, parts) -> bool:
        if self.full:
            return False
        self.sent.append(parts)
        return True

    async def send_wait(self, parts, timeout: float = 10.0) -> None:
        while not self.send(parts):
            await asyncio.sleep(0.001)

    def kinds(self) -> list[str]:
        return [wire.decode_header(p[0]).kind for p in self.sent]

    def events(self) -> list[Event]:
        return [decode_event_msgpack(p[1]) for p in self.sent if wire.decode_header(p[0]).kind == wire.EVENT]


class Frame:
    def __init__(self, data: bytes) -> None:
        self.bytes = data
        self.buffer = memoryview(data)


def submit(link: FakeLink, session: str, sub: Submission) -> None:
    head = wire.Header(wire.SUBMIT, session=session)
    link.handlers[wire.SUBMIT](head, [Frame(wire.header(wire.SUBMIT, session=session)), Frame(encode_msgpack(sub))])


def configure() -> ConfigureSession:
    return ConfigureSession(provider=ModelProviderInfo(name="p"), model="m", instructions=None,
                            approval_policy=AskForApproval.NEVER,
                            sandbox_policy=SandboxPolicy.from_mode("read-only"), cwd="/tmp")


def delta(n: int) -> Event:
    return Event(id="t", msg=ExecCommandOutputDeltaEvent("c", ExecOutputStream.STDOUT, b"%d" % n))


def test_outbox_keeps_order_while_the_link_is_full_and_drops_only_deltas_past_its_limit() -> None:
    async def main():
        link = FakeLink()
        box = Outbox(link, limit=3)
        box.event("s", Event(id="t", msg=AgentMessageDeltaEvent("a")))
        link.full = True
        for n in range(5):
            box.event("s", delta(n))
        box.event("s", Event(id="t", msg=AgentMessageDeltaEvent("b")))  # never dropped
        link.full = False
        box.event("s", Event(id="t", msg=AgentMessageDeltaEvent("c")))  # behind the waiting ones
        await box.flush(2.0)
        return link

    link = asyncio.run(main())
    got = [getattr(e.msg, "delta", None) or e.msg.chunk for e in link.events()]
    assert got == ["a", b"0", b"1", b"2", "b", "c"]
    assert all(wire.decode_header(p[0]).session == "s" for p in link.sent)


class StubSession:
    """Records submissions; a user_input blocks until ``release`` (a slow submission)."""

    def __init__(self, log: list[str], release: asyncio.Event) -> None:
        self.log = log
        self.release = release
        self.closed = False
        self.config = None

    async def submit(self, sub: Submission) -> None:
        name = type(sub.op).__name__
        self.log.append(f"start {name} {sub.id}")
        if isinstance(sub.op, ConfigureSession):
            self.config = sub.op
        if isinstance(sub.op, UserInput):
            await self.release.wait()
        if isinstance(sub.op, Shutdown):
            self.closed = True
        self.log.append(f"end {name} {sub.id}")

    def error(self, sub_id: str, message: str) -> None:
        self.log.append(f"error {message}")

    async def aclose(self) -> None:
        self.closed = True


def test_submissions_go_in_order_but_an_interrupt_goes_at_once_and_shutdown_closes() -> None:
    async def main():
        link = FakeLink()
        log: list[str] = []
        release = asyncio.Event()
        made: list[str] = []

        def make(session_id, emit):
            made.append(session_id)
            return StubSession(log, release)

        host = SessionHost(link, runner=None, make_session=make)
        sid = "0d4f6c1e-8a51-4b7f-9a57-7f0f9a3c2b10"
        submit(link, sid, Submission("0", configure()))
        submit(link, sid, Submission("1", UserInput([TextInput("slow")])))
        submit(link, sid, Submission("2", UserInput([TextInput("queued")])))
        submit(link, sid, Submission("3", Interrupt()))
        deadline = asyncio.get_running_loop().time() + 5
        while "end Interrupt 3" not in log and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        assert log == ["start ConfigureSession 0", "end ConfigureSession 0", "start UserInput 1",
                       "start Interrupt 3", "end Interrupt 3"]
        release.set()
        submit(link, sid, Submission("4", Shutdown()))
        for _ in range(100):
            if sid not in host.sessions:
                break
            await asyncio.sleep(0.01)
        assert made == [sid] and sid not in host.sessions
        assert log[5:] == ["end UserInput 1", "start UserInput 2", "end UserInput 2", "start Shutdown 4",
                           "end Shutdown 4"]
        assert link.kinds()[-1] == wire.CLOSED
        # A submission that does not decode is answered with an error event for its session.
        head = wire.Header(wire.SUBMIT, session=sid)
        link.handlers[wire.SUBMIT](head, [Frame(b""), Frame(b"\xc1")])
        (error,) = link.events()
        assert type(error.msg).__name__ == "ErrorEvent" and "invalid submission" in error.msg.message
        # A submission that crossed the close is answered, and hosts no new session.
        submit(link, sid, Submission("5", UserInput([TextInput("late")])))
        late = link.events()[-1]
        assert late.id == "5" and late.msg.message == f"unknown session {sid}"
        assert made == [sid] and sid not in host.sessions
        await host.aclose()

    asyncio.run(main())


def test_a_submission_that_does_not_decode_is_answered_with_an_error_event() -> None:
    """Not UTF-8, or nested deeper than the stack, where the daemon (which reads only a
    submission's head) lets it through: an error event for the session, never a traceback."""
    not_utf8 = msgspec.msgpack.encode({"id": "1", "op": {"type": "user_input", "items": [
        {"type": "text", "text": msgspec.Raw(b"\xa2\xff\xfe")}]}})
    deep = msgspec.msgpack.encode({"id": "2", "op": {"type": "user_input", "items": [
        {"type": "text", "text": "x", "extra": msgspec.Raw(b"\x91" * 100_000 + b"\xc0")}]}})

    async def main():
        link = FakeLink()
        host = SessionHost(link, runner=None, make_session=lambda session_id, emit: None)
        head = wire.Header(wire.SUBMIT, session="s")
        for body in (not_utf8, deep):
            link.handlers[wire.SUBMIT](head, [Frame(b""), Frame(body)])
        await host.aclose()
        return link

    messages = [e.msg.message for e in asyncio.run(main()).events()]
    assert messages == ["invalid submission: a string is not valid UTF-8", "invalid submission: nested too deeply"]
