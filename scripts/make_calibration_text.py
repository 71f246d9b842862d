"""Write the default calibration text `models/calibration/general_en_code.txt` (run once; the output is
committed), used by AWQ, GPTQ and pruning for checkpoints that ship no `calibration.txt` of their own.

    python scripts/make_calibration_text.py [--out models/calibration/general_en_code.txt] [--kb 64]

General technical English and Python code, the text an instruct model on a robot mostly sees, that
tests reach offline: from a fixed list of pure-Python standard-library modules *other than* the held-out
text's (scripts/make_heldout_text.py), alternately a module's prose docstrings and a stretch of its code
with comments (docstrings stripped, so prose is not counted twice), read with `ast` and `tokenize`,
never imported. tests/test_heldout_text.py checks it shares no 8-word passage with the held-out text.
"""

from __future__ import annotations

import argparse
import ast
import io
import platform
import sysconfig
import textwrap
import tokenize
from pathlib import Path

from make_heldout_text import MODULES as HELDOUT_MODULES  # a sibling script
from make_heldout_text import docstrings

MODULES = [
    "asyncio/base_events.py",
    "asyncio/tasks.py",
    "calendar.py",
    "configparser.py",
    "csv.py",
    "datetime.py",
    "_pydecimal.py",
    "enum.py",
    "ftplib.py",
    "gettext.py",
    "gzip.py",
    "ipaddress.py",
    "locale.py",
    "mailbox.py",
    "optparse.py",
    "pickle.py",
    "pprint.py",
    "queue.py",
    "random.py",
    "sched.py",
    "selectors.py",
    "socketserver.py",
    "statistics.py",
    "threading.py",
    "typing.py",
    "urllib/parse.py",
    "uuid.py",
    "zipfile.py",
]
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "models" / "calibration" / "general_en_code.txt"


def code_without_docstrings(source: str) -> str:
    """The module's source with every docstring removed (comments and code kept), blank runs squeezed."""
    tree = ast.parse(source)
    drop: set[int] = set()
    for node in [tree, *ast.walk(tree)]:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = [ln for i, ln in enumerate(source.splitlines(), 1) if i not in drop]
    out: list[str] = []
    for ln in lines:
        if ln.strip() or (out and out[-1].strip()):
            out.append(ln.rstrip())
    text = "\n".join(out)
    list(tokenize.generate_tokens(io.StringIO(text).readline))  # still valid Python: the cut was clean
    return text


def build(kb: int) -> tuple[str, list[str]]:
    """Round-robin over the modules, one piece (docstrings and whole definitions' code, alternately) from
    each in turn, until the budget: any prefix of the text (load_calibration reads its first tokens) spans
    every module, prose and code alike."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    queues: list[list[str]] = []
    for rel in MODULES:
        if rel in HELDOUT_MODULES:
            raise SystemExit(f"{rel} is a held-out module")
        source = (stdlib / rel).read_text(encoding="utf-8")
        prose = [d for d in docstrings(source) if d.isascii()]
        tops = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        code = [code_without_docstrings(ast.get_source_segment(source, n) or "") for n in tops]
        code = [c for c in code if 200 <= len(c) <= 3000 and c.isascii()]  # whole definitions, not giants
        first, second = (prose, code) if len(queues) % 2 == 0 else (code, prose)  # both kinds in every round
        queues.append([x for pair in zip(first, second, strict=False) for x in pair])
    parts: list[str] = []
    size, budget = 0, kb * 1000
    while size < budget and any(queues):
        for q in queues:
            if q and size < budget:
                piece = q.pop(0)
                parts.append(piece)
                size += len(piece) + 2
    return "\n\n".join(parts) + "\n", [m.removesuffix(".py") for m in MODULES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--kb", type=int, default=64, help="approximate size of the text in KB")
    args = ap.parse_args()
    body, modules = build(args.kb)
    about = (
        "Default calibration text for edge-runtime (general technical English and Python code): docstrings and "
        f"code of the CPython {platform.python_version()} standard-library modules {', '.join(modules)}; extracted "
        "by scripts/make_calibration_text.py. Source: CPython, Copyright (c) Python Software Foundation, under "
        "the PSF License Agreement (https://docs.python.org/3/license.html)."
    )
    # The provenance goes beside the text, not into it: every byte of the text is calibration input.
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(body, encoding="utf-8")
    readme = args.out.with_name("README.md")
    readme.write_text(f"# {args.out.name}\n\n" + textwrap.fill(about, 98) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(body)} characters from {len(modules)} modules")


if __name__ == "__main__":
    main()
