"""What a chat turn's encoding costs as the conversation grows: a full encode of the rendered conversation
against ConversationEncoder's incremental one (edge_runtime/conversation.py), same ids asserted.

    python scripts/conversation_encode_cost.py CHECKPOINT_DIR [--exchanges 1000 5000]

The checkpoint is exported once (fp32, a small ring) for its tokenizer and chat template.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

MSG = "The robot arm moved the red block onto the blue one and reported the new positions of both. " * 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--exchanges", type=int, nargs="+", default=[1000, 5000])
    a = ap.parse_args()
    from edge_runtime.bundle import open_bundle
    from edge_runtime.chat import ChatTemplate
    from edge_runtime.conversation import ConversationEncoder
    from edge_runtime.exporters.export import ExportOptions, export
    from edge_runtime.tokenizer import Tokenizer

    out = Path(tempfile.mkdtemp()) / "b"
    export(ExportOptions(checkpoint=a.checkpoint, out=out, window=64))
    b = open_bundle(out)
    template, tok = ChatTemplate.for_bundle(b), Tokenizer(b.tokenizer_file, b.manifest.tokenizer)
    for n in a.exchanges:
        history = [{"role": r, "content": MSG} for _ in range(n) for r in ("user", "assistant")]
        enc = ConversationEncoder(tok)
        enc.encode(template.render(history[:-1], add_generation_prompt=True))  # last turn, before its reply
        history.append({"role": "user", "content": "Where is the red block now?"})
        t0 = time.perf_counter()
        text = template.render(history, add_generation_prompt=True)
        t1 = time.perf_counter()
        ids = enc.encode(text)
        t2 = time.perf_counter()
        full = tok.encode(text, add_special_tokens=False)
        t3 = time.perf_counter()
        assert ids == full
        print(f"{n} exchanges, {len(ids)} tokens: render {1e3 * (t1 - t0):.0f} ms, incremental encode "
              f"{1e3 * (t2 - t1):.1f} ms ({enc.reencoded} chars), full encode {1e3 * (t3 - t2):.0f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
