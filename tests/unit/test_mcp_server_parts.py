"""The parts of ``sluice mcp`` that need no process: what a `run` keeps of its output,
what a session keeps and says it lost, how a command is given, which schema a protocol
version gets."""

from __future__ import annotations

import pytest

from broker.cli.mcp import tools as T


def test_capture_keeps_head_and_tail_and_says_how_much_it_left_out() -> None:
    cap = T.Capture()
    cap.add(b"a" * T.OUTPUT_HEAD)
    cap.add(b"b" * 100)
    cap.add(b"c" * T.OUTPUT_TAIL)
    assert cap.total == T.OUTPUT_HEAD + 100 + T.OUTPUT_TAIL and cap.truncated
    text = cap.text()
    assert text.startswith("a" * T.OUTPUT_HEAD + "\n[... 100 bytes left out ...]\n") and text.endswith("c" * T.OUTPUT_TAIL)
    small = T.Capture()
    small.add(b"hello\n")
    assert small.text() == "hello\n" and not small.truncated


def test_a_session_keeps_its_last_bytes_and_reports_the_loss() -> None:
    s = T.Session("s1", ["cat"], None)
    s.on_output(None, 1, b"x" * T.SESSION_KEEP)
    s.on_output(None, 1, b"y" * 10)
    out = s.take(True)["structuredContent"]
    assert out["dropped_bytes"] == 10 and out["more"]
    assert out["output"] == "x" * T.SESSION_READ_MAX  # the oldest kept, up to one read's worth
    texts = [out["output"]]
    while True:
        rest = s.take(True)["structuredContent"]
        assert rest["dropped_bytes"] == 0
        texts.append(rest["output"])
        if not rest["more"]:
            break
    assert sum(map(len, texts)) == T.SESSION_KEEP and texts[-1].endswith("x" + "y" * 10)


@pytest.mark.parametrize("arguments, argv", [({"command": "ls -l"}, ["bash", "-lc", "ls -l"]),
                                             ({"argv": ["ls", "-l"]}, ["ls", "-l"])])
def test_a_command_is_a_shell_line_or_an_argv(arguments, argv) -> None:
    assert T.argv_of(arguments) == argv


@pytest.mark.parametrize("arguments", [{}, {"command": "x", "argv": ["x"]}, {"command": ""}, {"argv": []},
                                       {"argv": [1]}, {"argv": [""]}, {"command": ["ls"]}])
def test_a_bad_command_is_a_tool_error(arguments) -> None:
    with pytest.raises(T.ToolError):
        T.argv_of(arguments)


def test_older_protocol_versions_get_no_output_schemas() -> None:
    assert all("outputSchema" in t for t in T.tools_for("2025-06-18"))
    assert not any("outputSchema" in t or "title" in t for t in T.tools_for("2025-03-26"))


def test_a_session_read_does_not_cut_a_character() -> None:
    s = T.Session("s1", ["cat"], None)
    s.on_output(None, 1, b"a" + "é".encode() * T.SESSION_READ_MAX)
    texts = []
    while True:
        out = s.take(True)["structuredContent"]
        texts.append(out["output"])
        if not out["more"]:
            break
    assert len(texts) == 3 and "".join(texts) == "a" + "é" * T.SESSION_READ_MAX  # no U+FFFD at a seam
