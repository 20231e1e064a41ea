"""The pure parts of how frontends show a session (broker/cli/render.py): patches as diffs,
approval questions and confirmations, terminal safety, token counts, the status line."""

from __future__ import annotations

import shlex
import time

from broker.cli.render import (
    APPROVAL_PROMPT_VIEW,
    NO_SANDBOX,
    QUESTION_LINES,
    RETRIED,
    HumanRenderer,
    SafeStream,
    answer_confirmation,
    approval_question,
    command_text,
    describe_approval,
    format_tokens,
    patch_diff,
    patch_summary,
    safe_text,
    shell_script,
    visible,
)
from broker.wire.protocol import (
    AddFileChange,
    AgentMessageDeltaEvent,
    ApplyPatchApprovalRequestEvent,
    ApprovalResolvedEvent,
    CallToolResult,
    DeleteFileChange,
    ErrorEvent,
    Event,
    ExecApprovalRequestEvent,
    ExecCommandBeginEvent,
    ExecCommandOutputDeltaEvent,
    ExecCommandStdinTypedEvent,
    ExecOutputStream,
    McpToolCallBeginEvent,
    McpToolCallEndEvent,
    PatchApplyBeginEvent,
    PatchApplyEndEvent,
    ReviewDecision,
    TaskCompleteEvent,
    TaskStartedEvent,
    TokenCountEvent,
    TurnAbortedEvent,
    UpdateFileChange,
)

CHANGES = {
    "/w/hello.py": UpdateFileChange("@@ -1,2 +1,2 @@\n def greet():\n-    print('hi')\n+    print('hello')\n"),
    "/w/new.py": AddFileChange("a = 1\nb = 2\n"),
    "/w/old.py": DeleteFileChange(),
}


# -- patches ----------------------------------------------------------------------------


def test_a_patch_is_a_unified_diff_per_file_styled_by_line() -> None:
    shown = patch_diff(CHANGES, "/w")
    texts = [text for text, _ in shown]
    assert texts == [
        "M hello.py (+1 -1)", "--- a/hello.py", "+++ b/hello.py",
        "@@ -1,2 +1,2 @@", " def greet():", "-    print('hi')", "+    print('hello')",
        "A new.py (new file, +2)", "--- /dev/null", "+++ b/new.py", "@@ -0,0 +1,2 @@", "+a = 1", "+b = 2",
        "D old.py (deleted)",
    ]
    styles = dict(shown)
    assert styles["-    print('hi')"] == "31" and styles["+    print('hello')"] == "32"
    assert styles["@@ -1,2 +1,2 @@"] == "36" and styles[" def greet():"] == ""


def test_a_moved_file_names_both_paths() -> None:
    shown = patch_diff({"/w/a.py": UpdateFileChange("@@ -1 +1 @@\n-x\n+y\n", "/w/b.py")}, "/w")
    assert shown[0][0] == "M a.py -> b.py (+1 -1)" and shown[2][0] == "+++ b/b.py"


def test_patch_summary_counts_files_and_lines() -> None:
    assert patch_summary(CHANGES, "/w") == "3 files changed, +3 -1 (M hello.py, A new.py, D old.py)"
    assert patch_summary({"/w/x": AddFileChange("1\n")}, "/w") == "1 file changed, +1 -0 (A x)"


# -- commands and approval questions -------------------------------------------------------


def test_shell_scripts_are_recognised() -> None:
    assert shell_script(["bash", "-lc", "echo hi"]) == "echo hi"
    assert shell_script(["/bin/sh", "-c", "ls"]) == "ls"
    assert shell_script(["bash", "-x", "ls"]) is None and shell_script(["python", "-c", "1"]) is None
    assert command_text(["bash", "-lc", "echo 'hi there' | wc -c"]) == "echo 'hi there' | wc -c"
    assert command_text(["ls", "a b"]) == "ls 'a b'"


def test_a_multi_line_script_is_asked_as_the_script_and_says_it_runs_unsandboxed() -> None:
    script = "set -e\ncd src\nmake 'all'\n"
    lines, cut = approval_question(ExecApprovalRequestEvent("c1", ["bash", "-lc", script], "/w", "needs network"), "/w")
    texts = [text for text, _ in lines]
    assert texts[:3] == ["The agent asks to run a command without the sandbox.", '  the model says: "needs network"',
                         "  Its bash script, line by line:"]
    assert texts[3:6] == ["    set -e", "    cd src", "    make 'all'"]
    assert texts[-3:] == [NO_SANDBOX, "  command: bash -lc 'set -e\\ncd src\\nmake '\"'\"'all'\"'\"'\\n'", "  in: /w"]
    assert "WITHOUT the sandbox" in NO_SANDBOX and not cut


def test_a_one_line_command_and_the_retry_without_sandbox() -> None:
    msg = ExecApprovalRequestEvent("c1", ["touch", "x"], "/w", "command failed; retry without sandbox?")
    lines, _ = approval_question(msg)
    assert [text for text, _ in lines] == [
        "The agent asks to run a command without the sandbox.", f"  {RETRIED}", NO_SANDBOX,
        "  command: touch x", "  in: /w"]
    assert describe_approval(msg) == "run `touch x` in /w without the sandbox (it failed in the sandbox)"


def test_a_long_script_is_cut_and_shown_whole_on_request() -> None:
    script = "\n".join(f"echo {i}" for i in range(100))
    msg = ExecApprovalRequestEvent("c1", ["bash", "-lc", script], "/w")
    lines, cut = approval_question(msg)
    assert cut and len(lines) == 2 + QUESTION_LINES + 1 + 3
    assert lines[-4][0] == f"... {100 - QUESTION_LINES} more lines ([v] shows them all)"
    assert lines[-2][0] == "  command: " + visible(shlex.join(msg.command)) and lines[-1][0] == "  in: /w"
    lines, cut = approval_question(msg, full=True)
    assert not cut and [t for t, _ in lines[2:102]] == [f"    echo {i}" for i in range(100)]


def test_a_patch_question_shows_its_diff_and_ends_with_its_files() -> None:
    msg = ApplyPatchApprovalRequestEvent("p1", CHANGES, grant_root="/elsewhere")
    lines, cut = approval_question(msg, "/w")
    texts = [text for text, _ in lines]
    assert texts[0] == "The agent asks to apply a patch to 3 files:"
    assert "+    print('hello')" in texts and "+b = 2" in texts
    assert "/elsewhere" in texts[-3] and not cut
    assert texts[-2:] == ["  files: hello.py, new.py, old.py", "  in: /w"]


def test_a_patch_request_says_its_grant_once() -> None:
    """The agent's reason for a patch restates its grant_root (Codex's shape has both):
    the one line a frontend writes about it, and the question, name the root once."""
    reason = "grant write access to /elsewhere for this session"
    msg = ApplyPatchApprovalRequestEvent("p1", CHANGES, reason=reason, grant_root="/elsewhere")
    line = describe_approval(msg, "/w")
    assert line == "apply a patch to hello.py, new.py, old.py (and allow writes beneath /elsewhere for this session)"
    texts = [text for text, _ in approval_question(msg, "/w")[0]]
    assert sum(text.count("/elsewhere") for text in texts) == 1, texts


def test_each_answer_is_confirmed_in_words() -> None:
    cmd = ExecApprovalRequestEvent("c1", ["ls"], "/w")
    patch = ApplyPatchApprovalRequestEvent("p1", CHANGES)
    assert answer_confirmation(cmd, ReviewDecision.DENIED) == "denied: the model is told so"
    assert answer_confirmation(cmd, ReviewDecision.APPROVED) == "approved: running it without the sandbox"
    assert answer_confirmation(cmd, ReviewDecision.APPROVED_FOR_SESSION).startswith("approved for this session")
    assert answer_confirmation(patch, ReviewDecision.APPROVED) == "approved: applying the patch"
    assert answer_confirmation(patch, ReviewDecision.ABORT) == "denied: the turn is aborted"


# -- terminal safety ----------------------------------------------------------------------


def test_control_sequences_are_shown_not_obeyed() -> None:
    assert safe_text("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert safe_text("\x1b]0;title\x07") == "\\x1b]0;title\\x07"
    assert safe_text("a\tb\nc\r\nd\re\x9b2J\x7f") == "a\tb\nc\r\nd\\re\\x9b2J\\x7f"
    assert safe_text("héllo ✓") == "héllo ✓"


def test_a_stream_is_made_safe_across_chunk_boundaries() -> None:
    stream = SafeStream()
    data = "ok ✓\r\nred \x1b[31m\u009b\n".encode()
    out = b"".join(stream.feed(data[i:i + 1]) for i in range(len(data))) + stream.flush()
    assert out.decode() == "ok ✓\r\nred \\x1b[31m\\x9b\n"
    assert SafeStream().feed(b"\xff\n") == "\ufffd\n".encode()


def _renderer(tmp_path, name="r", **kw):
    out, err = open(tmp_path / f"{name}.out", "wb+"), open(tmp_path / f"{name}.err", "wb+")
    render = HumanRenderer({"cwd": "/w"}, out_fd=out.fileno(), err_fd=err.fileno(), color=False, **kw)
    render.files = (out, err)  # kept open as long as the renderer
    def read():
        return (tmp_path / f"{name}.out").read_bytes().decode(), (tmp_path / f"{name}.err").read_bytes().decode()
    return render, read


def test_the_renderer_escapes_model_text_and_command_output(tmp_path) -> None:
    render, read = _renderer(tmp_path)
    render.event(Event("1", AgentMessageDeltaEvent("\x1b]52;c;ZXZpbA==\x07hi\n")))
    render.event(Event("1", ExecCommandOutputDeltaEvent("c1", ExecOutputStream.STDOUT, b"\x1b[2J\n")))
    render.event(Event("1", ErrorEvent("bad \x1b[31m")))
    out, err = read()
    assert out == "\\x1b]52;c;ZXZpbA==\\x07hi\n"
    assert "\\x1b[2J\n" in err and "error: bad \\x1b[31m" in err and "\x1b" not in out + err


def test_typing_into_a_command_is_one_escaped_bounded_line(tmp_path) -> None:
    render, read = _renderer(tmp_path)
    render.event(Event("5", ExecCommandStdinTypedEvent("call_3", "print(6*7)\n", "frontend-4 (sluice web)")))
    render.event(Event("6", ExecCommandStdinTypedEvent("call_3", "\x1b]0;pwned\x07\x03" + "y" * 500, "f", omitted=7)))
    _, err = read()
    first, second = err.splitlines()
    assert first == "frontend-4 (sluice web) typed into call_3: print(6*7)\\n"
    assert second.startswith("f typed into call_3: \\x1b]0;pwned\\x07\\x03yyy") and second.endswith(
        "... (400 more characters) (+7 characters not in the event)")
    assert "\x1b" not in err


def test_an_approved_command_is_marked_unsandboxed_when_it_runs(tmp_path) -> None:
    render, read = _renderer(tmp_path, me="frontend-1")
    request = ExecApprovalRequestEvent("c1", ["curl", "x"], "/w")
    render.event(Event("1", request))
    render.event(Event("1", ApprovalResolvedEvent("c1", ReviewDecision.APPROVED, "frontend-2 (sluice attach)")))
    render.event(Event("1", ExecCommandBeginEvent("c1", ["curl", "x"], "/w")))
    render.event(Event("1", ExecCommandBeginEvent("c2", ["ls"], "/w")))
    render.answered(ExecApprovalRequestEvent("c3", ["make"], "/w"), ReviewDecision.APPROVED_FOR_SESSION)
    render.event(Event("1", ExecCommandBeginEvent("c4", ["make"], "/w")))
    _, err = read()
    assert err.splitlines() == [
        "frontend-2 (sluice attach) answered: approved",
        "$ curl x", "  (running WITHOUT the sandbox, as approved)",
        "$ ls",
        "approved for this session: this command runs without the sandbox, and from now on without asking",
        "$ make", "  (running WITHOUT the sandbox, as approved)",
    ]


def test_a_patch_is_summed_up_when_applied(tmp_path) -> None:
    render, read = _renderer(tmp_path)
    render.event(Event("1", PatchApplyBeginEvent("p1", True, CHANGES)))
    render.event(Event("1", PatchApplyEndEvent("p1", "", "", True)))
    _, err = read()
    assert err.startswith("patch:\nM hello.py (+1 -1)\n")
    assert err.endswith("[patch applied: 3 files changed, +3 -1 (M hello.py, A new.py, D old.py)]\n")


def test_token_counts_once_per_turn_unless_verbose(tmp_path) -> None:
    counts = [TokenCountEvent(input_tokens=10, cached_input_tokens=2, output_tokens=5, total_tokens=15),
              TokenCountEvent(input_tokens=20, output_tokens=1, total_tokens=21)]
    assert format_tokens(counts) == "tokens: 30 in (2 cached), 6 out, 36 total"
    render, read = _renderer(tmp_path)
    for c in counts:
        render.event(Event("1", c))
    assert read()[1] == ""
    render.event(Event("1", TaskCompleteEvent(None)))
    assert read()[1] == "tokens: 30 in (2 cached), 6 out, 36 total\n"
    verbose, read_verbose = _renderer(tmp_path, "v", verbose=True)
    for c in counts:
        verbose.event(Event("1", c))
    verbose.event(Event("1", TaskCompleteEvent(None)))
    assert read_verbose()[1].splitlines() == ["tokens: 10 in (2 cached), 5 out, 15 total",
                                              "tokens: 20 in, 1 out, 21 total"]


def test_an_interrupt_the_frontend_announced_is_one_line(tmp_path) -> None:
    render, read = _renderer(tmp_path)
    render.interrupt_noted = True
    render.note("interrupting (Ctrl-C again to leave at once)")
    render.event(Event("1", ErrorEvent("Turn interrupted")))
    render.event(Event("1", TurnAbortedEvent("interrupted")))
    assert read()[1] == "sluice: interrupting (Ctrl-C again to leave at once)\n"
    render.event(Event("2", TaskStartedEvent()))
    render.event(Event("2", TurnAbortedEvent("interrupted")))  # by someone else: said
    assert read()[1].endswith("turn aborted (interrupted)\n")


def test_notes_said_once_are_not_repeated(tmp_path) -> None:
    render, read = _renderer(tmp_path)
    for _ in range(3):
        render.note_once("run on a terminal")
    assert read()[1] == "sluice: run on a terminal\n"


def test_the_status_line_shows_while_busy_and_is_cleared_before_output(tmp_path) -> None:
    render, read = _renderer(tmp_path, status=True)
    render.tick()
    assert read()[1] == ""  # no turn yet
    render.event(Event("1", TaskStartedEvent()))
    render.tick(now=time.monotonic() + 1)  # a second in silence
    assert read()[1].startswith("\r\x1b[K") and "working" in read()[1]
    render.event(Event("1", AgentMessageDeltaEvent("hi\n")))
    err = read()[1]
    assert err.endswith("\r\x1b[K") and read()[0] == "hi\n"
    quiet, read_quiet = _renderer(tmp_path, "q", status=False)
    quiet.event(Event("1", TaskStartedEvent()))
    quiet.tick(now=time.monotonic() + 1)
    assert read_quiet()[1] == "" and quiet.tick_interval is None
    assert APPROVAL_PROMPT_VIEW.endswith("[v]iew in full: ")


def test_mcp_calls_are_shown_and_what_servers_say_is_made_safe(tmp_path) -> None:
    render, read = _renderer(tmp_path)
    render.event(Event("1", McpToolCallBeginEvent("m1", "time", "now", {"tz": "UTC"})))
    result = CallToolResult([{"type": "text", "text": "\x1b[31m12:00\x1b]0;x\x07"}, {"type": "image", "data": "..."}])
    render.event(Event("1", McpToolCallEndEvent("m1", True, result)))
    render.event(Event("1", McpToolCallEndEvent("m2", True, CallToolResult([], is_error=True))))
    assert read()[1].splitlines() == [
        'mcp: time.now({"tz": "UTC"})', "  \\x1b[31m12:00\\x1b]0;x\\x07", "[mcp ok]", "[mcp error]"]
