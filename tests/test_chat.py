"""Chat templates and tokenization against `transformers`: the same text, the same ids, the same refusals."""

from __future__ import annotations

import json
import shutil

import pytest

from edge_runtime.bundle import open_bundle
from edge_runtime.chat import ChatTemplate
from edge_runtime.errors import ChatTemplateError
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.models import DEMO_CHECKPOINT
from edge_runtime.tokenizer import Tokenizer

from .tiny_models import save_tiny_checkpoint

transformers = pytest.importorskip("transformers")

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama-2/Mistral style: BOS from the template's variables, alternation enforced with raise_exception.
ALTERNATING = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
# Tools through tojson (transformers' own, which does not escape HTML), a namespace, loop controls, a generation block.
TOOLS = (
    "{%- set ns = namespace(n=0) -%}"
    "{%- if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'system' %}{% continue %}{% endif -%}"
    "{%- set ns.n = ns.n + 1 -%}"
    "{%- if m['role'] == 'assistant' %}{% generation %}A{{ ns.n }}: {{ m['content'] }}{% endgeneration %}"
    "{%- else %}U{{ ns.n }}: {{ m['content'] }}{% endif %}\n{% endfor -%}"
    "{%- if add_generation_prompt %}A:{% endif %}{{ strftime_now('%Y') | length }}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief & <exact>."},
        {"role": "user", "content": "Name a planet."},
        {"role": "assistant", "content": "Mars."},
        {"role": "user", "content": "Another, with ünïcode — please."},
    ],
]
TOOL_LIST = [{"type": "function", "function": {"name": "move_to", "parameters": {"x": {"type": "number"}}}}]


@pytest.fixture(scope="module")
def demo_hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(str(DEMO_CHECKPOINT))


def _render_ref(hf, template, messages, **kw):
    return hf.apply_chat_template(messages, chat_template=template, tokenize=False, **kw)


@pytest.mark.parametrize("template", [CHATML, ALTERNATING, TOOLS], ids=["chatml", "alternating", "tools"])
@pytest.mark.parametrize("gen", [True, False])
def test_render_equals_transformers(demo_hf_tokenizer, template, gen):
    ours = ChatTemplate(template, demo_hf_tokenizer.special_tokens_map)
    convs = CONVERSATIONS if template is not ALTERNATING else [CONVERSATIONS[0], CONVERSATIONS[1][1:]]
    for messages in convs:
        for tools in (None, TOOL_LIST):
            ref = _render_ref(demo_hf_tokenizer, template, messages, add_generation_prompt=gen, tools=tools)
            assert ours.render(messages, add_generation_prompt=gen, tools=tools) == ref


def test_template_refusals_are_one_line_errors(demo_hf_tokenizer):
    ours = ChatTemplate(ALTERNATING, demo_hf_tokenizer.special_tokens_map)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="roles must alternate") as e:
        ours.render(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ChatTemplateError, match="syntax error on line 1"):
        ChatTemplate("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ChatTemplateError, match="refused"):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="refused"):  # the sandbox: no attribute writes, no imports
        ChatTemplate("{{ ''.__class__.__subclasses__() }}").render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "empty"),
        ("hello", "must be a list"),
        ([{"role": "usr", "content": "x"}], "role 'usr'"),
        ([{"role": "user", "content": 3}], "content must be a string"),
        ([{"role": "user", "content": {"text": "x"}}], "content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "image_url"),
        ([{"role": "user"}], "no content"),
        (["user: hi"], "must be an object"),
    ],
)
def test_bad_messages_are_refused_by_name(messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        ChatTemplate(CHATML).render(messages)


def test_text_parts_and_none_fields_render_like_plain_strings():
    t = ChatTemplate(CHATML)
    plain = t.render([{"role": "user", "content": "ab"}])
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert t.render([{"role": "user", "content": parts, "name": None}]) == plain


def _with_tokenizer_config(src, dst, **config):
    shutil.copytree(src, dst)
    path = dst / "tokenizer_config.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(config)
    path.write_text(json.dumps(data))
    return dst


TEXTS = ["ROMEO.\nWhat light", "", "  spaces  and\ttabs", "ünïcode — ok", "<s> literal special </s>"]


@pytest.mark.parametrize(
    "config",
    [{}, {"add_bos_token": False}, {"add_bos_token": True, "add_eos_token": True}],
    ids=["as-shipped", "no-bos", "bos-and-eos"],
)
def test_bundle_tokenizer_encodes_like_autotokenizer(tmp_path, config):
    """The demo model's post-processor adds BOS; tokenizer_config.json flags override it as transformers does."""
    ckpt = _with_tokenizer_config(DEMO_CHECKPOINT, tmp_path / "ck", chat_template=CHATML, **config)
    out = tmp_path / "b"
    export(ExportOptions(checkpoint=ckpt, out=out, window=100))
    bundle = open_bundle(out)
    ours = Tokenizer(bundle.tokenizer_file, bundle.manifest.tokenizer)
    hf = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"], text
    template = ChatTemplate.for_bundle(bundle)
    for messages in CONVERSATIONS:
        ref = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ours.encode(template.render(messages), add_special_tokens=False) == list(ref)


def test_tiny_checkpoint_tokenizer_encodes_like_autotokenizer(tmp_path):
    save_tiny_checkpoint("llama-tied", tmp_path / "ck")
    out = tmp_path / "b"
    export(ExportOptions(checkpoint=tmp_path / "ck", out=out, window=100))
    bundle = open_bundle(out)
    ours = Tokenizer(bundle.tokenizer_file, bundle.manifest.tokenizer)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "ck"))
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"], text
    assert bundle.manifest.tokenizer.chat_template is None
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        ChatTemplate.for_bundle(bundle)


def test_template_variables_defaults_and_refusals():
    """with_variables sets every render's defaults without touching the original; a render's own win; names
    the conversation owns (messages, tools ...) and non-names are refused by name."""
    t = ChatTemplate("{{ messages[0]['content'] }}{% if enable_thinking is defined %}:{{ enable_thinking }}{% endif %}")
    msgs = [{"role": "user", "content": "hi"}]
    off = t.with_variables({"enable_thinking": False})
    assert (t.render(msgs), off.render(msgs), off.render(msgs, enable_thinking=True)) == ("hi", "hi:False", "hi:True")
    for bad, name in (({"messages": []}, "'messages'"), ({"add_generation_prompt": 1}, "add_generation"),
                      ({"not a name": 1}, "'not a name'"), ({1: 2}, "1")):  # fmt: skip
        with pytest.raises(ChatTemplateError, match=name):
            t.with_variables(bad)
    with pytest.raises(ChatTemplateError, match="object"):
        t.with_variables([("enable_thinking", False)])


def test_at_pins_the_templates_clock():
    """at(when): strftime_now reads `when` (Llama 3.2's and SmolLM3's headers carry the date); without it, the clock."""
    from datetime import datetime

    t = ChatTemplate("Today {{ strftime_now('%d %b %Y %H:%M:%S.%f') }}\n{{ messages[0]['content'] }}")
    when = datetime(2026, 12, 5, 23, 59, 59, 999999)
    msgs = [{"role": "user", "content": "hi"}]
    assert t.at(when).render(msgs) == "Today 05 Dec 2026 23:59:59.999999\nhi"
    assert t.at(when).with_variables({"x": 1}).render(msgs) == t.at(when).render(msgs)  # kept through copies
    assert t.render(msgs).startswith(f"Today {datetime.now():%d %b %Y}") and t.clock is None
