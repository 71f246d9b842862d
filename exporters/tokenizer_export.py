"""The bundle's tokenizer: `tokenizer.json` as `transformers` would apply it, the chat template and special tokens.

The runtime has no `transformers` and no model knowledge, so whatever `AutoTokenizer` would decide from
`tokenizer_config.json` is decided here, once, and baked into the bundle's files:

- BOS/EOS: `transformers` (5.x) applies `tokenizer.json`'s own post-processor and ignores tokenizer_config.json's
  `add_bos_token` / `add_eos_token` whenever a `tokenizer.json` exists (`_from_pretrained` drops them), so the
  bundle's copy is the checkpoint's as is and `encode(text)` in the runtime gives `tokenizer(text)["input_ids"]`
  with no BOS rule of its own (SmolLM2's post-processor adds none; the demo model's adds `<s>`).
- The chat template: `chat_template.jinja` beside the checkpoint, else `tokenizer_config.json`'s
  `chat_template` (a string, or the list of named templates whose `default` entry is taken).
- Special tokens as strings (`bos_token`, `eos_token`, ...): templates read them as variables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from edge_runtime.errors import CheckpointError, ConfigError
from edge_runtime.manifest import TokenizerSpec
from edge_runtime.models.base import check_in_vocab

from .checkpoint import Checkpoint

TOKENIZER_FILE, CHAT_TEMPLATE_FILE = "tokenizer.json", "chat_template.jinja"
# The named special tokens `transformers` passes to a chat template (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_MAX_TEMPLATE_BYTES = 1 << 20  # the largest templates on the Hub are ~30 KB; a bigger file is not a template


@dataclass(frozen=True)
class BundleTokenizer:
    spec: TokenizerSpec
    tokenizer: Tokenizer  # post-processor already as `transformers` applies it
    chat_template: str | None

    def write(self, directory: Path) -> None:
        self.tokenizer.save(str(directory / TOKENIZER_FILE))
        if self.chat_template is not None:
            (directory / CHAT_TEMPLATE_FILE).write_text(self.chat_template, encoding="utf-8")


def bundle_tokenizer(ckpt: Checkpoint) -> BundleTokenizer:
    if ckpt.tokenizer_file is None:
        raise CheckpointError(f"'{ckpt.path}' has no tokenizer.json; a bundle needs the fast-tokenizer file")
    try:
        tok = Tokenizer.from_file(str(ckpt.tokenizer_file))
    except Exception as e:  # tokenizers raises plain Exception subclasses
        raise CheckpointError(f"'{ckpt.tokenizer_file}' cannot be read by `tokenizers`: {e}") from e
    config = read_json(ckpt.path / "tokenizer_config.json")
    special = _special_tokens(config, ckpt.path)
    gen = read_json(ckpt.path / "generation_config.json")
    eos = list(ckpt.args.eos_token_ids)
    extra = gen.get("eos_token_id")
    for e in extra if isinstance(extra, list) else [extra] if isinstance(extra, int) else []:
        if isinstance(e, bool) or not isinstance(e, int) or e < 0:
            raise ConfigError(
                f"generation_config.json: 'eos_token_id' = {extra!r} must be a token id or a list of token ids"
            )
        check_in_vocab((e,), ckpt.args.vocab_size, "generation_config.json: 'eos_token_id'")
        if e not in eos:
            eos.append(e)
    bos = ckpt.args.bos_token_id
    probe = tok.encode("a").ids
    pad = ckpt.config.get("pad_token_id")
    template = _chat_template(config, ckpt.path)
    spec = TokenizerSpec(
        file=TOKENIZER_FILE,
        bos_token_id=bos,
        eos_token_ids=eos,
        pad_token_id=pad if isinstance(pad, int) else None,
        adds_bos=bool(probe) and bos is not None and probe[0] == bos,
        chat_template=CHAT_TEMPLATE_FILE if template is not None else None,
        special_tokens=special,
    )
    return BundleTokenizer(spec=spec, tokenizer=tok, chat_template=template)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens(config: dict[str, Any], where: Path) -> dict[str, str]:
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        if config.get(name) is None:
            continue
        text = _token_text(config[name])
        if text is None:
            raise CheckpointError(f"'{where / 'tokenizer_config.json'}': {name} must be a string, got {config[name]!r}")
        out[name] = text
    return out


def _chat_template(config: dict[str, Any], where: Path) -> str | None:
    file = where / CHAT_TEMPLATE_FILE
    if file.is_file():
        if file.stat().st_size > _MAX_TEMPLATE_BYTES:
            raise CheckpointError(f"'{file}' is larger than {_MAX_TEMPLATE_BYTES} bytes; not a chat template")
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"cannot read '{file}': {e}") from e
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise CheckpointError(
        f"'{where / 'tokenizer_config.json'}': chat_template must be a string or a list of named templates "
        "with a 'default' entry"
    )


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"'{path}' is not valid JSON: {e}") from e
    return data if isinstance(data, dict) else {}
