"""Write the held-out evaluation text `models/eval/python_docstrings.txt` (run once; the output is committed).

    python scripts/make_heldout_text.py [--out models/eval/python_docstrings.txt] [--kb 60]

English prose that is not Shakespeare (the demo model's training and calibration text) and that
tests reach offline: the docstrings of a fixed list of pure-Python standard-library modules, read
from their source with `ast` (never imported, so nothing runs), in source order. Doctest lines
(`>>>`, `...`) are dropped: we want prose. Each module contributes at most an equal share of the
budget so no single module dominates. The file is generated once and committed, so perplexities do
not move with the Python version that happens to be installed; the header records which one made it.
"""

from __future__ import annotations

import argparse
import ast
import platform
import sysconfig
import textwrap
from pathlib import Path

# Pure-Python modules with long, prose-heavy docstrings (paths relative to the stdlib directory).
MODULES = [
    "argparse.py",
    "textwrap.py",
    "json/__init__.py",
    "json/decoder.py",
    "logging/__init__.py",
    "logging/handlers.py",
    "pathlib.py",
    "unittest/case.py",
    "unittest/mock.py",
    "email/message.py",
    "email/utils.py",
    "http/client.py",
    "difflib.py",
    "string.py",
    "collections/__init__.py",
    "functools.py",
    "contextlib.py",
    "dataclasses.py",
    "shutil.py",
    "subprocess.py",
    "tempfile.py",
    "inspect.py",
    "fractions.py",
    "heapq.py",
]
MIN_CHARS = 120  # shorter docstrings are mostly one-line summaries ("Return the name.")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "models" / "eval" / "python_docstrings.txt"


def docstrings(source: str) -> list[str]:
    """Docstrings of the module, its classes and functions, in source order, doctest lines removed."""
    tree = ast.parse(source)
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    out = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if not doc:
            continue
        lines = [ln.rstrip() for ln in doc.splitlines() if not ln.lstrip().startswith((">>>", "... "))]
        text = "\n".join(lines).strip()
        if len(text) >= MIN_CHARS and text.isascii():
            out.append(text)
    return out


def build(kb: int) -> tuple[str, list[str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    share = kb * 1000 // len(MODULES)
    seen: set[str] = set()
    parts: list[str] = []
    for rel in MODULES:
        used = 0
        for doc in docstrings((stdlib / rel).read_text(encoding="utf-8")):
            if doc in seen:  # inherited copies (e.g. the same text on two overloads)
                continue
            if used + len(doc) > share and used:
                break
            seen.add(doc)
            parts.append(doc)
            used += len(doc) + 2
    return "\n\n".join(parts) + "\n", [m.removesuffix(".py") for m in MODULES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--kb", type=int, default=60, help="approximate size of the text in KB")
    args = ap.parse_args()
    body, modules = build(args.kb)
    about = (
        "Held-out evaluation text for edge-runtime (English prose, not Shakespeare): docstrings of the "
        f"CPython {platform.python_version()} standard-library modules {', '.join(modules)}; extracted by "
        "scripts/make_heldout_text.py (doctest lines dropped). Source: CPython, Copyright (c) Python Software "
        "Foundation, under the PSF License Agreement (https://docs.python.org/3/license.html). Readers skip "
        "these leading '#' lines and the blank line after them."
    )
    header = "".join(f"# {line}\n" for line in textwrap.wrap(about, 98)) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + body, encoding="utf-8")
    print(f"wrote {args.out}: {len(body)} characters from {len(modules)} modules")


if __name__ == "__main__":
    main()
