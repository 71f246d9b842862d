from __future__ import annotations

import os

# Tests run on 2-core CI machines: keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")
