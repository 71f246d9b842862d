"""Tokenizer wrapper and an incremental detokenizer that never emits broken UTF-8.

Byte-level BPE tokens can split a character across tokens; decoding a partial sequence then ends
in U+FFFD. The detokenizer holds text back until it decodes cleanly, and re-decodes only a short
suffix per token (the prefix/read offsets of vLLM's incremental detokenizer), not the whole text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from .errors import BundleError
from .manifest import TokenizerSpec
from .rss import trim_heap


class Tokenizer:
    def __init__(self, path: Path, spec: TokenizerSpec):
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exceptions
            raise BundleError(f"cannot read tokenizer '{path}': {e}") from e
        trim_heap()  # the JSON's parse buffers, freed, back to the OS (a large vocabulary's are hundreds of MB)
        self.spec = spec

    @classmethod
    def for_engine(cls, engine: Any) -> Tokenizer:
        """The tokenizer shipped in a loaded engine's bundle."""
        return cls(engine.bundle.tokenizer_file, engine.manifest.tokenizer)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Ids as `transformers`' `tokenizer(text)` gives them: BOS/EOS exactly where the bundle's post-processor
        puts them (the exporter wrote it the way `transformers` applies tokenizer_config.json). Text rendered by a
        chat template carries its own special tokens: encode it with `add_special_tokens=False`, as
        `apply_chat_template` does."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


class StreamingDetokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []  # only the tail still needed: constant memory on unbounded streams
        self._prefix = 0  # ids[_prefix:_read] decode to text already emitted
        self._read = 0

    def add(self, token: int) -> str:
        """Append a token; return the newly complete text (possibly empty)."""
        self.ids.append(token)
        before = self.tok.decode(self.ids[self._prefix : self._read])
        after = self.tok.decode(self.ids[self._prefix :])
        if after == before:
            # The pending tokens add no text at all, not even U+FFFD (special tokens, which decode skips):
            # dropping them changes no later text and keeps a stream of them in constant memory.
            del self.ids[self._read :]
            return ""
        if len(after) > len(before) and not after.endswith("\ufffd"):
            new = after[len(before) :]
            del self.ids[: self._read]  # the new prefix starts at the old read offset
            self._prefix, self._read = 0, len(self.ids)
            return new
        return ""

    def flush(self) -> str:
        """Text still held back at the end; an incomplete trailing character is dropped, not emitted."""
        before = self.tok.decode(self.ids[self._prefix : self._read])
        rest = self.tok.decode(self.ids[self._prefix :])[len(before) :].rstrip("\ufffd")
        self.ids.clear()
        self._prefix = self._read = 0
        return rest
