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

A template file of the user's (`edge-export --chat-template FILE`) replaces the checkpoint's, or gives one to a
checkpoint or GGUF that has none; it is read and rendered on a test conversation before any export work
(read_template_file), and again with the checkpoint's special tokens once they are known (with_template).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from edge_runtime.bounded_read import read_text_bounded
from edge_runtime.chat import ChatTemplate, check_template_bounds
from edge_runtime.errors import ChatTemplateError, CheckpointError, ConfigError, ExportError
from edge_runtime.manifest import TemplateOrigin, TokenizerSpec
from edge_runtime.models.base import check_in_vocab

from .checkpoint import Checkpoint

TOKENIZER_FILE, CHAT_TEMPLATE_FILE = "tokenizer.json", "chat_template.jinja"
# The named special tokens `transformers` passes to a chat template (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_MAX_TEMPLATE_BYTES = 1 << 20  # the largest templates on the Hub are ~30 KB; a bigger file is not a template
_MAX_CONFIG_BYTES = 64 << 20  # tokenizer_config.json (thousands of added tokens, templates), generation_config
# The check conversation: two user turns with a reply between, so a template's loop, its role alternation and
# its generation prompt all run. The last user text must survive into the prompt: a template that reads a key
# messages do not have (`m.text`) renders it as nothing, without an error.
_CHECK_QUESTION = "What is the capital of France"
_CHECK_CONVERSATION = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello, how can I help you today?"},
    {"role": "user", "content": _CHECK_QUESTION},
)
# Before the checkpoint's tokenizer is read (a GGUF is not even converted yet), templates get stand-ins for the
# special tokens, so `bos_token + ...` is not refused as undefined; with_template renders again with the real ones.
_STAND_IN_TOKENS = {name: f"<{name.removesuffix('_token')}>" for name in SPECIAL_TOKEN_NAMES}


@dataclass(frozen=True)
class TemplateFile:
    """A chat template from a file of the user's (`edge-export --chat-template FILE`), read and checked."""

    path: Path  # as given
    text: str
    takes_system: bool  # False: the template refuses a system message (it rendered the check without one)

    @property
    def origin(self) -> TemplateOrigin:
        return TemplateOrigin(source="file", path=str(self.path), sha256=_sha256(self.text))


def read_template_file(path: Path) -> TemplateFile:
    """The template in `path`, compiled and rendered on the check conversation by the runtime's own sandboxed
    ChatTemplate; every problem is one ExportError naming the file."""
    name = f"--chat-template '{path}'"
    if path.is_dir():
        raise ExportError(f"{name} is a directory; give the template file (e.g. its chat_template.jinja)")
    # a regular file only (a FIFO would block, /dev/zero never end), and at most a size no template reaches
    text = read_text_bounded(path, _MAX_TEMPLATE_BYTES, "--chat-template", ExportError)
    takes_system = check_template(text, _STAND_IN_TOKENS, name)
    return TemplateFile(path=path, text=text, takes_system=takes_system)


def check_template(text: str, special_tokens: dict[str, str], name: str) -> bool:
    """Compile `text` and render the check conversation, with its system message and, where the template
    refuses one (Mistral's alternation check), without; True when the system message was taken. Raises
    ExportError naming `name` for a syntax error, a template that fails, or one whose prompt is empty or
    lacks the last user message."""
    try:
        template = ChatTemplate(text, special_tokens, origin=name)
    except ChatTemplateError as e:  # the line number is Jinja's, of the file
        raise ExportError(" ".join(str(e).split())) from None
    try:
        try:
            prompt, takes_system = template.render(list(_CHECK_CONVERSATION), add_generation_prompt=True), True
        except ChatTemplateError:
            prompt, takes_system = template.render(list(_CHECK_CONVERSATION[1:]), add_generation_prompt=True), False
    except ChatTemplateError as e:  # a template's own raise_exception message may span lines
        raise ExportError(" ".join(f"{e} (the check conversation: user, assistant, user)".split())) from None
    if not prompt.strip():
        raise ExportError(f"{name} renders a two-turn conversation as empty text; it would give the model no prompt")
    if _CHECK_QUESTION not in prompt:
        raise ExportError(
            f"{name} renders a two-turn conversation without its last user message; does it read message['content']?"
        )
    return takes_system


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class BundleTokenizer:
    spec: TokenizerSpec
    tokenizer: Tokenizer  # post-processor already as `transformers` applies it
    chat_template: str | None
    template_origin: TemplateOrigin | None = None  # where chat_template came from (None with it)

    def write(self, directory: Path) -> None:
        self.tokenizer.save(str(directory / TOKENIZER_FILE))
        if self.chat_template is not None:
            (directory / CHAT_TEMPLATE_FILE).write_text(self.chat_template, encoding="utf-8")

    def with_template(self, given: TemplateFile) -> BundleTokenizer:
        """This tokenizer with `given` as its chat template, checked again with the checkpoint's special tokens."""
        check_template(given.text, self.spec.special_tokens, f"--chat-template '{given.path}'")
        return dataclasses.replace(
            self,
            spec=dataclasses.replace(self.spec, chat_template=CHAT_TEMPLATE_FILE),
            chat_template=given.text,
            template_origin=given.origin,
        )


def check_source_template(tokenizer: BundleTokenizer) -> None:
    """The source's own chat template held to the runtime's bounds (chat.check_template_bounds) before the
    export's work: one every chat would refuse (a syntax error, a render that loops or builds a huge string) is
    not written into a bundle. CheckpointError in one line; --chat-template FILE replaces such a template."""
    if tokenizer.chat_template is None:
        return
    origin = tokenizer.template_origin
    where = f"the chat template of '{origin.path}'" if origin is not None else "the checkpoint's chat template"
    try:
        check_template_bounds(tokenizer.chat_template, tokenizer.spec.special_tokens, origin=where)
    except ChatTemplateError as e:
        why = " ".join(str(e).split())
        raise CheckpointError(f"{why}; give a working one with --chat-template FILE") from None


def bundle_tokenizer(ckpt: Checkpoint, *, converted_from: Path | None = None) -> BundleTokenizer:
    """`converted_from`: the .gguf file `ckpt` was converted from, whose metadata its chat template came from."""
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
    origin = None
    if template is not None and converted_from is not None:
        origin = TemplateOrigin(source="gguf", path=str(converted_from), sha256=_sha256(template))
    elif template is not None:
        file = ckpt.path / CHAT_TEMPLATE_FILE  # _chat_template's order: this file first, then tokenizer_config.json
        file = file if file.is_file() else ckpt.path / "tokenizer_config.json"
        origin = TemplateOrigin(source="checkpoint", path=str(file), sha256=_sha256(template))
    return BundleTokenizer(spec=spec, tokenizer=tok, chat_template=template, template_origin=origin)


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
    try:  # bounded: a tokenizer_config.json with its chat templates is tens of KB
        data = json.loads(read_text_bounded(path, _MAX_CONFIG_BYTES, "checkpoint file", CheckpointError))
    except (json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"'{path}' is not valid JSON: {e}") from e
    return data if isinstance(data, dict) else {}
