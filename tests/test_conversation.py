"""The incremental conversation encoder: ids equal a full encode of every rendered conversation, turn after
turn, through the real model's ChatML template and ChatML- and Llama-3-style ones on a tiny tokenizer;
re-encoding only the last turn where the text grows, everything where it does not."""

from __future__ import annotations

import pytest

from edge_runtime.bundle import open_bundle
from edge_runtime.chat import ChatTemplate
from edge_runtime.conversation import ConversationCache, ConversationEncoder
from edge_runtime.tokenizer import Tokenizer

WORDS = ["Move the red block", " onto the blue one.", "Done: red at (3, 4), blue at (3, 5)!", "  ", "\n\nok ", "é✓"]


def _turns(n: int) -> list[dict[str, str]]:
    return [{"role": ("user", "assistant")[i % 2], "content": WORDS[i % len(WORDS)] * (1 + i % 3)} for i in range(n)]


def _check_growing(template: ChatTemplate, tok: Tokenizer, turns: int = 24) -> ConversationEncoder:
    enc = ConversationEncoder(tok)
    for n in range(1, turns + 1):
        text = template.render(_turns(n), add_generation_prompt=n % 2 == 1)
        assert enc.encode(text) == tok.encode(text, add_special_tokens=False), n
    return enc


@pytest.fixture(scope="module")
def real(real_int4_bundle):
    b = open_bundle(real_int4_bundle)  # the session's real-model bundle: no export of its own
    return ChatTemplate.for_bundle(b), Tokenizer(b.tokenizer_file, b.manifest.tokenizer)


def test_real_model_chatml_equals_a_full_encode_and_reencodes_only_the_last_turn(real):
    template, tok = real
    enc = _check_growing(template, tok)
    text = template.render(_turns(25), add_generation_prompt=False)
    assert enc.encode(text) == tok.encode(text, add_special_tokens=False)
    assert enc.reencoded < len(text) // 10  # the last turn and the one it follows, not the conversation


def test_an_edited_message_reencodes_from_before_it(real):
    template, tok = real
    enc = ConversationEncoder(tok)
    turns = _turns(8)
    enc.encode(template.render(turns, add_generation_prompt=True))
    redone = []
    for i in (6, 0):  # a late message edited, then the first: re-encoded from the turn before each
        turns[i] = {"role": turns[i]["role"], "content": "something else"}
        text = template.render(turns, add_generation_prompt=False)
        assert enc.encode(text) == tok.encode(text, add_special_tokens=False)
        redone.append(enc.reencoded)
    assert redone[0] < redone[1] <= len(text)


def test_other_template_shapes_on_a_tiny_tokenizer(tied_bundle):
    """Special tokens around the role (ChatML-like) and inside a header with text between (Llama 3-like)."""
    b = open_bundle(tied_bundle)
    tok = Tokenizer(b.tokenizer_file, b.manifest.tokenizer)
    chatml = (
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
    )
    llama3 = (
        "{% for m in messages %}<s>{{ m['role'] }}</s>\n\n{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant</s>\n\n{% endif %}"
    )
    for source in (chatml, llama3):
        _check_growing(ChatTemplate(source), tok)


def test_a_template_without_special_tokens_falls_back_to_full_encodes(tied_bundle):
    b = open_bundle(tied_bundle)
    tok = Tokenizer(b.tokenizer_file, b.manifest.tokenizer)
    plain = ChatTemplate("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    enc = _check_growing(plain, tok, turns=6)
    assert enc.reencoded == len(enc.text)


def test_the_servers_cache_continues_each_of_several_interleaved_conversations(tied_bundle):
    b = open_bundle(tied_bundle)
    tok = Tokenizer(b.tokenizer_file, b.manifest.tokenizer)
    chatml = ChatTemplate("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}")
    cache = ConversationCache(tok, size=2)
    a, c = _turns(12), [{"role": "user", "content": "another robot"}, *_turns(11)]
    for n in range(1, 12):
        for turns in (a, c):  # two clients taking turns
            text = chatml.render(turns[:n])
            encoded = cache.encode(text)
            assert encoded.ids == tok.encode(text, add_special_tokens=False)
            cache.keep(encoded)  # served
    assert encoded.reencoded < len(text) // 2 and len(cache) == 2  # each continued its own


def _chatml_cache(tied_bundle, **kw):
    b = open_bundle(tied_bundle)
    tok = Tokenizer(b.tokenizer_file, b.manifest.tokenizer)
    chatml = ChatTemplate("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}")
    return ConversationCache(tok, **kw), chatml, tok


def test_a_request_that_is_never_served_leaves_the_cache_as_it_was(tied_bundle):
    cache, chatml, tok = _chatml_cache(tied_bundle)
    served = cache.encode(chatml.render(_turns(4)))
    cache.keep(served)
    before = cache.nbytes
    for i in range(9):  # refused (beyond the window, say): encoded, never kept
        text = chatml.render([{"role": "user", "content": f"{i} " + "to be or not " * 20_000}])
        assert cache.encode(text).ids == tok.encode(text, add_special_tokens=False)
    assert len(cache) == 1 and cache.nbytes == before
    again = cache.encode(chatml.render(_turns(5)))  # the served conversation still continues
    assert again.reencoded < len(chatml.render(_turns(5))) // 2


def test_the_cache_is_bounded_in_bytes_least_recently_kept_first(tied_bundle):
    probe, chatml, tok = _chatml_cache(tied_bundle)
    texts = [chatml.render([{"role": "user", "content": f"client {i}: " + "a rose " * 10_000}]) for i in range(6)]
    probe.keep(probe.encode(texts[0]))
    one = probe.nbytes  # the text and its ids
    assert one > len(texts[0])
    bound = 3 * one + one // 2
    cache = ConversationCache(tok, size=8, max_bytes=bound)
    for text in texts:
        cache.keep(cache.encode(text))
        assert cache.nbytes <= bound
    assert len(cache) == 3
    assert cache.encode(texts[-1]).reencoded < 100  # the last kept is still there: only its tail re-encoded
    assert cache.encode(texts[0]).reencoded == len(texts[0])  # the first was evicted
    huge = cache.encode(chatml.render([{"role": "user", "content": "a rose " * 40_000}]))
    cache.keep(huge)  # over the whole bound: not kept, and nothing else evicted for it
    assert len(cache) == 3 and cache.encode(texts[-1]).reencoded < 100
