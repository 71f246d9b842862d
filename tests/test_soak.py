"""Long-run soak (slow marker; `pytest -m slow`): constant memory over a 20,000-token generation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "soak_rss.py"


@pytest.mark.slow
def test_20k_tokens_grow_rss_by_less_than_5mb():
    r = subprocess.run([sys.executable, str(SCRIPT), "--tokens", "20000"], capture_output=True, text=True)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "growth" in r.stdout
