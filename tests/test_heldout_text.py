"""The committed held-out text (models/eval/python_docstrings.txt) used by scripts/quality_table.py and
scripts/streaming_ppl.py: present, plain UTF-8 English, long enough, and disjoint from calibration text."""

from __future__ import annotations

import re
from pathlib import Path

from models import CHECKPOINTS_DIR, GENERAL_CALIBRATION

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "models" / "eval" / "python_docstrings.txt"
SHINGLE = 8  # words: longer runs than common phrases ("the name of the file to be"), shorter than a sentence


def _body() -> str:
    lines = HELDOUT.read_text(encoding="utf-8").splitlines()
    header = [ln for ln in lines[:20] if ln.startswith("#")]
    assert header, "the file starts with a '#' header naming its source"
    return "\n".join(lines[len(header) :])


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z']+", text.lower())
    return {tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def test_heldout_text_is_committed_utf8_ascii_and_long_enough() -> None:
    raw = HELDOUT.read_bytes()
    raw.decode("utf-8")
    assert raw.isascii()
    head = " ".join(ln.lstrip("# ") for ln in raw.decode().splitlines() if ln.startswith("#"))
    assert "Python Software Foundation" in head and "scripts/make_heldout_text.py" in head
    assert 40_000 <= len(_body()) <= 60_000  # ~12k SmolLM2 tokens: >= 4,000 for every measurement


def test_heldout_text_shares_no_passage_with_any_calibration_text() -> None:
    held = _shingles(_body())
    calibration = [*sorted(CHECKPOINTS_DIR.glob("*/calibration.txt")), GENERAL_CALIBRATION]
    assert calibration, "the demo model's calibration.txt (the exporters' fallback) is where it was"
    for path in calibration:
        common = held & _shingles(path.read_text(encoding="utf-8"))
        assert not common, f"{path} shares {len(common)} {SHINGLE}-word passages, e.g. {' '.join(min(common))}"
