"""Rebuild a `tokenizers` tokenizer (tokenizer.json) and tokenizer_config.json from GGUF metadata.

A GGUF carries its vocabulary as llama.cpp sees it: `tokenizer.ggml.model` (gpt2 = byte-level BPE,
llama = SentencePiece-style BPE with byte fallback), the tokens, merges or scores, per-token types
and `tokenizer.ggml.pre`, the name of the pre-tokenizer llama.cpp applies before the merges. We map
that name onto the split rules llama.cpp's llama-vocab.cpp uses for it, and refuse names we do not
know rather than guess: a wrong split gives plausible but different token ids.
"""

from __future__ import annotations

import functools
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from edge_runtime.errors import CheckpointError

from .gguf_reader import GGUFFile

# llama.cpp token types (llama_token_type / gguf.TokenType).
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    # ByteLevel's own regex is GPT-2's: 's|'t|... | ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm() -> pre_tokenizers.PreTokenizer:
    # llama.cpp's SMOLLM: every digit on its own ("\p{N}"), then GPT-2's split; SmolLM's own
    # tokenizer.json spells the same thing as Digits(individual) + ByteLevel.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _split(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


_PRE_TOKENIZERS = {
    "default": _gpt2,
    "gpt2": _gpt2,
    "gpt-2": _gpt2,
    "smollm": _smollm,
    "llama3": functools.partial(_split, _LLAMA3_SPLIT),
    "llama-v3": functools.partial(_split, _LLAMA3_SPLIT),
    "llama-bpe": functools.partial(_split, _LLAMA3_SPLIT),
    "smaug-bpe": functools.partial(_split, _LLAMA3_SPLIT),
    "qwen2": functools.partial(_split, _QWEN2_SPLIT),
    "deepseek-r1-qwen": functools.partial(_split, _QWEN2_SPLIT),
}
# llama.cpp turns BOS on for these pre-tokenizers when the file does not say (Llama 3 adds <|begin_of_text|>).
_BOS_BY_DEFAULT = {"llama3", "llama-v3", "llama-bpe", "smaug-bpe"}


@functools.lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's bytes -> printable characters map (the spelling of every byte-level token)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def build_tokenizer(gg: GGUFFile) -> tuple[Tokenizer, dict[str, Any]]:
    """(tokenizer, tokenizer_config) for the vocabulary the file describes."""
    # Every key read with the GGUF type it must have: tokens stored as integers or scores as strings would
    # otherwise fail deep inside the tokenizer build with a traceback.
    kind = gg.require("tokenizer.ggml.model", kind="str")
    tokens: list[str] = gg.require("tokenizer.ggml.tokens", kind="str[]")
    types: list[int] = gg.meta("tokenizer.ggml.token_type", kind="int[]") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise CheckpointError(f"'{gg.path.name}': {len(tokens)} tokens but {len(types)} token types")
    pre = gg.meta("tokenizer.ggml.pre", "default", kind="str")
    if kind == "gpt2":
        tok = _byte_level_bpe(gg, tokens, pre)
        add_bos_default = pre in _BOS_BY_DEFAULT
    elif kind == "llama":
        tok = _sentencepiece_bpe(gg, tokens)
        add_bos_default = True  # llama.cpp's default for a SentencePiece vocabulary, as transformers assumes
    else:
        raise CheckpointError(
            f"'{gg.path.name}' has tokenizer model {kind!r}; edge-export reads 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece BPE)"
        )
    _add_special_tokens(tok, tokens, types, byte_level=kind == "gpt2")

    def token(key: str) -> str | None:
        i = gg.meta(f"tokenizer.ggml.{key}", kind="int")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    add_bos = gg.meta("tokenizer.ggml.add_bos_token", add_bos_default, kind="bool")
    add_eos = gg.meta("tokenizer.ggml.add_eos_token", False, kind="bool")
    bos, eos = token("bos_token_id"), token("eos_token_id")
    _post_processor(tok, bos if add_bos else None, eos if add_eos else None, byte_level=kind == "gpt2")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "clean_up_tokenization_spaces": False,
    }
    template = gg.meta("tokenizer.chat_template", kind="str")  # another type: one line, not a bundle without one
    if template is not None:
        config["chat_template"] = template
    return tok, config


def _byte_level_bpe(gg: GGUFFile, tokens: list[str], pre: str) -> Tokenizer:
    if pre not in _PRE_TOKENIZERS:
        raise CheckpointError(
            f"'{gg.path.name}' uses llama.cpp pre-tokenizer {pre!r}, which edge-export does not know; "
            f"known: {', '.join(sorted(_PRE_TOKENIZERS))}"
        )
    spell = _byte_alphabet()
    alphabet = set(spell.values())
    # Vocabulary tokens are stored in the byte alphabet already; a few converters store an added
    # token in plain UTF-8, which the BPE model must see spelled byte by byte.
    vocab = {t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)}
    merges = _merges(gg, gg.require("tokenizer.ggml.merges", kind="str[]"))
    tok = _bpe(gg, vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    if pre in ("qwen2", "deepseek-r1-qwen"):
        tok.normalizer = normalizers.NFC()  # Qwen2's own tokenizer.json normalizes to NFC first
    tok.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(gg: GGUFFile, tokens: list[str]) -> Tokenizer:
    """Llama-2-style: '▁' for spaces, BPE merges recovered from the scores, bytes as <0xNN> tokens."""
    scores: list[float] = gg.require("tokenizer.ggml.scores", kind="float[]")
    if len(scores) != len(tokens):
        raise CheckpointError(f"'{gg.path.name}': {len(tokens)} tokens but {len(scores)} token scores")
    vocab = {t: i for i, t in enumerate(tokens)}
    if gg.has("tokenizer.ggml.merges"):
        merges = _merges(gg, gg.meta("tokenizer.ggml.merges", kind="str[]"))
    else:
        # SentencePiece BPE merges the pair whose result scores best; every split of a token into
        # two vocabulary pieces is a candidate merge ranked by the token's score (transformers'
        # generate_merges does the same).
        ranked = []
        for t, i in vocab.items():
            for k in range(1, len(t)):
                left, right = t[:k], t[k:]
                if left in vocab and right in vocab:
                    ranked.append((-scores[i], vocab[left], vocab[right], left, right))
        merges = [(left, right) for *_, left, right in sorted(ranked)]
    unk = gg.meta("tokenizer.ggml.unknown_token_id", kind="int")
    tok = _bpe(
        gg,
        vocab=vocab,
        merges=merges,
        unk_token=tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "▁")]
    strip: list[decoders.Decoder] = []
    if gg.meta("tokenizer.ggml.add_space_prefix", True, kind="bool"):
        steps.insert(0, normalizers.Prepend("▁"))
        strip = [decoders.Strip(" ", 1, 0)]
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    return tok


def _bpe(gg: GGUFFile, **kw: Any) -> Tokenizer:
    try:
        return Tokenizer(models.BPE(**kw))
    except Exception as e:  # tokenizers raises a bare Exception, e.g. for a merge of a token not in the vocabulary
        raise CheckpointError(f"'{gg.path.name}': its tokens and merges do not make a BPE vocabulary: {e}") from e


def _merges(gg: GGUFFile, merges: list[str]) -> list[tuple[str, str]]:
    """'left right' strings as pairs; one without the space is refused by name (tokenizers' own error
    does not say which file or entry)."""
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bad = next((i for i, p in enumerate(pairs) if len(p) != 2), None)
    if bad is not None:
        raise CheckpointError(
            f"'{gg.path.name}': merge {bad} of 'tokenizer.ggml.merges' is {merges[bad][:40]!r}, not two tokens "
            "separated by a space"
        )
    return pairs  # type: ignore[return-value]


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: list[int], *, byte_level: bool) -> None:
    """Control tokens (<|im_start|> ...) become special added tokens and user-defined ones (<think>)
    plain added tokens, so the text matcher keeps them whole as llama.cpp does."""
    alphabet = set(_byte_alphabet().values()) if byte_level else None
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, types, strict=True)
        # A control token outside the byte alphabet is a converter's mislabel of a vocabulary
        # piece; adding it would not change ids and transformers skips it too.
        if kind == _CONTROL and (alphabet is None or set(t) <= alphabet)
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, types, strict=True)
        if kind == _USER_DEFINED
    ]
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)


def _post_processor(tok: Tokenizer, bos: str | None, eos: str | None, *, byte_level: bool) -> None:
    if bos is None and eos is None:
        if byte_level:
            tok.post_processor = processors.ByteLevel(trim_offsets=False)
        return
    ids = {t: tok.token_to_id(t) for t in (bos, eos) if t is not None}
    single = " ".join([*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else [])])
    pair = " ".join(
        [*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else []),
         *([f"{bos}:1"] if bos else []), "$B:1", *([f"{eos}:1"] if eos else [])]
    )  # fmt: skip
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, i) for t, i in ids.items() if i is not None]
    )
