"""Stop strings are bounded (count, length) and matched in time linear in each token's text: StopMatcher
behaves exactly as the plain matcher it replaced (same text emitted, same text held back, same cut), on
random inputs and on a 400-character stop string over thousands of tokens, the case that was quadratic."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from click.testing import CliRunner

from edge_runtime.cli.run import main as run_cli
from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.generate import MAX_STOP_CHARS, MAX_STOP_STRINGS, GenerationConfig, StopMatcher

from .bad_inputs_util import one_line_error


class NaiveStopMatcher:
    """The matcher StopMatcher replaced, kept as the reference: every prefix of every stop string compared with
    the end of the held text on every push (quadratic in a stop string's length)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        hold = max((k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        out, self.pending = self.pending[: len(self.pending) - hold], self.pending[len(self.pending) - hold :]
        return out, False


def _same(stops: Sequence[str], pieces: Sequence[str]) -> None:
    fast, naive = StopMatcher(stops), NaiveStopMatcher(stops)
    for n, piece in enumerate(pieces):
        assert fast.push(piece) == naive.push(piece), (stops, pieces[: n + 1])
        assert fast.pending == naive.pending, (stops, pieces[: n + 1])


def test_equals_the_plain_matcher_on_random_text_pieces_and_stop_strings():
    rng = random.Random(1234)
    for _ in range(3000):
        alphabet = "ab" if rng.random() < 0.5 else "abcé "  # small alphabets: many partial and overlapping matches
        stops = ["".join(rng.choices(alphabet, k=rng.randint(1, 7))) for _ in range(rng.randint(0, 4))]
        pieces = ["".join(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in range(rng.randint(1, 25))]
        _same(stops, pieces)  # a hit clears the held text; pushes after it go on from nothing, in both


def test_the_earliest_starting_stop_string_wins_even_when_another_ends_first():
    m = StopMatcher(["abcd", "bc"])
    assert m.push("xabcd") == ("x", True)  # "bc" ends first, "abcd" starts first: cut before "abcd"
    m = StopMatcher(["abcd", "bc"])
    assert m.push("xab") == ("x", False) and m.push("cz") == ("a", True)


def test_a_400_character_stop_string_over_thousands_of_tokens():
    # The worst shape for prefix matching: the text keeps matching a long prefix of the stop string and
    # failing on its last character, so the held text stays 399 characters long.
    stop = "a" * (MAX_STOP_CHARS - 1) + "b"
    rng = random.Random(7)
    pieces = ["a" * rng.randint(1, 4) for _ in range(3000)] + ["c", "a" * 150, "a" * 300, "b tail"]
    _same([stop, "ac"], pieces)
    m = StopMatcher([stop, "never"])
    for piece in pieces[:-1]:
        m.push(piece)
        assert len(m.pending) < MAX_STOP_CHARS  # held back: at most the longest stop string's length - 1
    assert m.push("b tail") == ("", True)  # the last 399 a's were all held, and are cut with the "b"


def test_too_many_or_too_long_stop_strings_are_refused():
    GenerationConfig(stop_strings=("x" * MAX_STOP_CHARS,) * MAX_STOP_STRINGS)  # the bounds themselves are fine
    with pytest.raises(EdgeRuntimeError, match=f"at most {MAX_STOP_STRINGS} stop strings, got 17"):
        GenerationConfig(stop_strings=("x",) * (MAX_STOP_STRINGS + 1))
    with pytest.raises(EdgeRuntimeError, match=f"at most {MAX_STOP_CHARS} characters, got one of 401"):
        GenerationConfig(stop_strings=("ok", "y" * (MAX_STOP_CHARS + 1)))


def test_edge_run_refuses_a_too_long_stop_string_in_one_line_before_loading(tmp_path):
    r = CliRunner().invoke(
        run_cli, ["--bundle", str(tmp_path / "nothing"), "--prompt", "hi", "--stop", "z" * 1_000_000]
    )
    one_line_error(r, f"at most {MAX_STOP_CHARS} characters", "got one of 1000000")
    assert len(r.stderr) < 300  # the message shows the start of the string, not the string
