"""What a raw log line is to the triage, decided once per *shape*: the line with every digit turned
into `0`. A long-running server's log repeats a few hundred shapes (access lines, metric lines) with
new numbers, so most lines are sorted by one `bytes.translate` and a dict lookup, without decoding
or cleaning them. That is what keeps the reader fast.

Why the shape decides exactly what the line would: the prefixes `reader.clean` strips treat every
digit alike (`\\d`, `isdigit`), so every line of one shape cleans to a text of the same length and
level, empty or not alike, and a word without digits is in one exactly where it is in the others.
Words with digits (`137`, `" HTTP/1.1" 5`) are looked for in the raw line itself: a raw line holds
everything its cleaned text holds, so that can only send a line the long way round, never skip one.

A new shape is learnt from its first line. The words that may be in a block's new lines are looked
for once in them all (`Shapes.find`); a line holding none of them is then told at sight, without
being cleaned (`Shapes.at_sight`), the others are cleaned and sorted among those found
(`Shapes.learn`). `tests/test_logtriage_fast_path.py` holds every verdict equal to the full path's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from .reader import LogLine

MAX_SHAPES = 16384         # shapes remembered; the memory stays flat (a few MiB at most)
MAX_SHAPE_BYTES = 512      # longer lines are sorted without being remembered
# Digits become "0"; control characters (ANSI colours included) become NUL, which marks a line
# that `clean` changes inside, not only at its ends: such a line is never sorted by its shape.
_SHAPE = bytes.maketrans(
    b"123456789" + bytes([*range(1, 9), *range(0x0B, 0x20), 0x7F]),
    b"000000000" + b"\x00" * (8 + 0x20 - 0x0B + 1))
_DIGIT = re.compile(r"\d")


class Shape(NamedTuple):   # a tuple: made for every new shape, so made cheaply
    """What every line of one shape is to the triage."""

    empty: bool                 # cleans to nothing: not a line at all
    full: bool                  # read in full whatever its digits: a CRITICAL line, or a trigger word
    raw_words: tuple[bytes, ...]   # words with digits its lines may hold: looked for in each raw line
    status: slice | None        # a line with only the access word: where its status code stands
    needles: tuple[tuple[str, int], ...]   # the signatures' needles it may hold (feed's candidates)
    goes_on: bool | None = False   # it goes on with an open traceback of its process (ASCII lines
    #                                only); None: not learnt yet (see Shapes.at_sight)
    pins: str | None = None     # the phase its traceback frame pins
    process: str | tuple[int, int] | None = None   # its process: the name, or where it stands (digits)
    marks: bool = False         # its only trigger words are marks (a shutdown's): see Shapes.__init__
    frame: bool = False         # it holds a traceback frame's start (Shapes.__init__'s `frame`)


_EMPTY = Shape(True, False, (), None, ())   # a line that cleans to nothing: skipped, as read_lines does


class DigitWord(NamedTuple):
    """A trigger word with digits: a line's shape tells whether the line may hold it."""

    raw: bytes
    shaped: bytes
    guard: str | None       # a digit-free trigger word it holds: it is only where that one is
    raw_only: bool          # it holds no digit-free word but the access word: looked for in raw lines
    needles: tuple[tuple[str, int], ...]   # itself, where it is a signature's needle


class Found(NamedTuple):
    """What may be in a block's new lines (see Shapes.find)."""

    words: tuple[str, ...]                # digit-free trigger words
    words_bytes: tuple[bytes, ...]        # the same, encoded
    digit_words: tuple[DigitWord, ...]


class Shapes:
    """The sorter for one pass over a log: a bounded memory of shapes seen, and how to learn one."""

    def __init__(self, triggers: tuple[str, ...], needles: tuple[tuple[str, int], ...],
                 access: re.Pattern[str], access_word: str, loud: tuple[str, ...],
                 goes_on: Callable[[str], tuple[bool, str | None]], marks: tuple[str, ...] = (),
                 frame: bytes = b"") -> None:
        """`marks`: trigger words that only mark a moment (a shutdown's start), which the reader
        notes itself: a line whose only trigger words they are is not read in full for them.
        `frame`: the start of a traceback frame (no digits: it is in a line where it is in its
        shape), which a shape marks (`Shape.frame`) for the reader to read such a line in full
        where no traceback is open."""
        words = [t for t in triggers if not _DIGIT.search(t)]
        # A word that holds another ("GatedRepoError" holds "rror") can only be where that one is:
        # each is looked for only where the first root it holds was found.
        roots = [w for w in words if not any(o != w and o in w for o in words)]
        self._roots = tuple((r, r.encode(), tuple((w, w.encode()) for w in words
                                                  if w not in roots and next(o for o in roots if o in w) == r))
                            for r in roots)
        self._digit_words = tuple(self._digit_word(t, words, needles, access_word)
                                  for t in triggers if _DIGIT.search(t))
        self._needles = needles
        self._needles_of: dict[tuple[str, ...], tuple[tuple[str, int], ...]] = {}   # words -> their needles
        self._quiet: dict[tuple[object, ...], Shape] = {}   # shapes without trigger words, shared
        self._access = re.compile(access.pattern.encode())   # digit-blind: it matches a shape as its lines
        self._access_word = access_word
        self._loud = loud
        self._loud_bytes = tuple(level.encode() for level in loud)
        self._goes_on = goes_on
        self._marks = frozenset(marks)
        self._frame = frame
        self.seen: dict[bytes, Shape] = {}
        # The last characters of the prefixes `clean` strips (a stamp's zone name: any capital),
        # and of a prefix the log's head taught (reader.LearntPrefix.end): a line ending in one may be
        # nothing but a prefix, so it is not told at sight.
        self.prefix_ends = b")]:0Z|"

    @staticmethod
    def _digit_word(word: str, words: list[str], needles: tuple[tuple[str, int], ...], access_word: str) -> DigitWord:
        held = [w for w in words if w in word]
        return DigitWord(word.encode(), word.encode().translate(_SHAPE), held[0] if held else None,
                         all(w == access_word for w in held), tuple((n, i) for n, i in needles if n == word))

    @staticmethod
    def key(raw: bytes) -> bytes | None:
        """The shape of a raw line, or None where control characters (`\\r` included) are inside."""
        key = raw.translate(_SHAPE)
        return None if b"\x00" in key else key

    def find(self, raws: list[bytes]) -> Found:
        """The trigger words that may be in `raws` (lines without colours), looked for once in them
        all, so that each new shape among them is sorted among these few; words with digits by
        their shape. A raw line holds every word its cleaned text holds."""
        joined = b"\n".join(raws)
        words: list[tuple[str, bytes]] = []
        for root, root_bytes, holders in self._roots:
            if root_bytes in joined:
                words.append((root, root_bytes))
                words.extend(w for w in holders if w[1] in joined)
        shaped = joined.translate(_SHAPE)
        found = {w for w, _ in words}
        return Found(tuple(w for w, _ in words), tuple(b for _, b in words),
                     tuple(d for d in self._digit_words if (d.guard is None or d.guard in found) and d.shaped in shaped))

    def at_sight(self, key: bytes, raw: bytes, found: Found) -> Shape | None:
        """A new shape told from its raw line alone, without cleaning it, where that is sure: none
        of the words `found` in its block and no loud level's name is in it, and it is ASCII and
        ends in a character that ends no prefix `clean` strips, so its text is not empty. What it
        is inside a traceback is learnt when one is open (`goes_on` None). Remembered."""
        end = key.rstrip()[-1:]
        if (not key.isascii() or end in self.prefix_ends or end.isupper() or any(map(raw.__contains__, self._loud_bytes))
                or any(map(raw.__contains__, found.words_bytes))):
            return None
        return self._remember(key, self._quiet_shape(tuple(d for d in found.digit_words if d.shaped in key),
                                                     None, None, None, frame=self._is_frame(key)))

    def learn(self, key: bytes, ln: LogLine, found: Found) -> Shape:
        """The meaning of `key`'s shape, from one line of it cleaned (`ln`), among what was
        `found` in its block; remembered. Any line of the shape gives the same (the module's doc)."""
        return self._remember(key, self._sort(key, ln, found))

    def _remember(self, key: bytes, shape: Shape) -> Shape:
        if len(key) <= MAX_SHAPE_BYTES:
            if len(self.seen) >= MAX_SHAPES:
                self.seen.clear()
            self.seen[key] = shape
        return shape

    def _is_frame(self, key: bytes) -> bool:
        return bool(self._frame) and self._frame in key

    def _quiet_shape(self, digit_words: tuple[DigitWord, ...], goes_on: bool | None, pins: str | None,
                     process: str | tuple[int, int] | None, marks: bool = False, frame: bool = False) -> Shape:
        """A shape holding no trigger word but marks: a few shared answers."""
        quiet = self._quiet.get((digit_words, goes_on, pins, process, marks, frame))
        if quiet is None:
            if len(self._quiet) >= MAX_SHAPES:   # a new process name per line: still bounded
                self._quiet.clear()
            raw_words, digit_needles = _parts(digit_words)
            quiet = self._quiet[digit_words, goes_on, pins, process, marks, frame] = Shape(
                False, False, raw_words, None, digit_needles, goes_on, pins, process, marks, frame)
        return quiet

    def _sort(self, key: bytes, ln: LogLine, found: Found) -> Shape:
        text = ln.text
        if not text:
            return _EMPTY
        words = [w for w in found.words if w in text]
        loud = ln.level in self._loud
        digit_words = tuple(d for d in found.digit_words if d.shaped in key)
        goes_on, pins = self._goes_on(text) if key.isascii() else (False, None)
        process = _process(key, ln.process) if goes_on else None
        frame = self._is_frame(key)
        if not loud and self._marks.issuperset(words):
            return self._quiet_shape(digit_words, goes_on, pins, process, bool(words), frame)
        full = loud or words != [self._access_word]
        status = None
        if not full:
            if key.isascii():   # ASCII: the bytes pattern reads as the text one
                prefix = len(key.rstrip()) - len(text)   # what `clean` strips: the text is the rest
                if (m := self._access.search(key, prefix)) is not None:
                    status = slice(m.start("status"), m.end("status"))
            else:   # not ASCII: the access line is read in full
                full = True
        needles = self._needles_of.get(tuple(words))
        if needles is None:
            needles = tuple((n, i) for n, i in self._needles if n in words)
            if len(self._needles_of) < MAX_SHAPES:
                self._needles_of[tuple(words)] = needles
        raw_words, digit_needles = _parts(digit_words)
        return Shape(False, full, raw_words, status, needles + digit_needles, goes_on, pins, process, frame=frame)


def _process(key: bytes, name: str | None) -> str | tuple[int, int] | None:
    """A shape's process: its name, or where it stands in the line when it holds digits (lines of
    one shape may name different workers: Worker_TP0, Worker_TP1). `(NAME pid=` holds a space,
    so no outer stamp before it can hold it: its first place in the line is the prefix."""
    if name is None or not _DIGIT.search(name):
        return name
    at = key.find(b"(" + name.encode().translate(_SHAPE) + b" pid=") + 1
    return (at, at + len(name))


def _parts(digit_words: tuple[DigitWord, ...]) -> tuple[tuple[bytes, ...], tuple[tuple[str, int], ...]]:
    """The raw words to look for in each line, and the needles, of a shape's digit words."""
    return tuple(d.raw for d in digit_words if d.raw_only), tuple(n for d in digit_words for n in d.needles)
