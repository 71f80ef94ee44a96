"""Generated text keeps the model's tokens: attention runs over exactly the ids ``generate``
chose (the prompt's encoding + the generated ids), never the decoded text tokenized again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mhsa
from tests.tiny import DECODER_SIZES

PROMPT = "the cat sat on the"
CORPUS = [
    "the cat sat on the mat and the dog sat on the log",
    "a librarian reads books; the cat reads nothing at all.",
    "transformers attend to tokens, heads attend to positions",
] * 20


@pytest.fixture(scope="module")
def tiny_gpt2_bpe_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """GPT-2 with a byte-level BPE tokenizer trained offline on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tok = GPT2TokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=4, eos_token_id=0
    )
    folder = tmp_path_factory.mktemp("gpt2-bpe")
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _direct_ids(lm: mhsa.engine.LoadedModel, prompt: str, steps: int, *, types: bool) -> list[int]:
    """transformers' own greedy ``generate`` on the tokenizer's encoding of the prompt
    (``types``: with the tokenizer's token_type_ids, which the model's forward takes)."""
    tok = lm.tokenizer
    enc = tok(prompt, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if types and "token_type_ids" in enc:
        inputs["token_type_ids"] = enc["token_type_ids"]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.no_grad():
        out = lm.head_model.generate(
            **inputs, max_new_tokens=steps, do_sample=False, pad_token_id=pad
        )
    return out[0].tolist()


def _check_generation(lm: mhsa.engine.LoadedModel, prompt: str, steps: int, *, types: bool) -> None:
    """The result's tokens are exactly transformers' generated ids, flagged from the prompt's
    end, with spans that cover the continuation in order."""
    expected = _direct_ids(lm, prompt, steps, types=types)
    g = mhsa.engine.generate_ids(prompt, model=lm, max_new_tokens=steps)
    assert list(g.ids) == expected
    n_prompt = len(lm.tokenizer(prompt)["input_ids"])
    assert g.prompt_tokens == n_prompt
    assert g.text == mhsa.engine.generate(prompt, model=lm, max_new_tokens=steps)
    for engine in ("transformers", "mhsa"):
        r = mhsa.engine.attend_generated(g, model=lm, engine=engine)
        assert r.tokens == lm.tokenizer.convert_ids_to_tokens(expected)
        assert r.num_tokens == len(expected)
        assert r.text == g.text
    assert r.generated_from == n_prompt
    assert not any(r.generated[:n_prompt])
    assert all(r.generated[n_prompt:])  # special tokens the model wrote included
    ends = [e for (s, e), sp in zip(r.offsets, r.special, strict=True) if not sp]
    assert ends == sorted(ends) and max(ends) <= len(g.text)
    spans = [span for span, gen in zip(r.offsets, r.generated, strict=True) if gen]
    cuts = [len(prompt)] + [c for span in spans for c in span] + [len(g.text)]
    assert cuts == sorted(cuts)  # in order, inside the continuation, only whitespace between
    assert all(not g.text[a:b].strip() for a, b in zip(cuts[::2], cuts[1::2], strict=True))
    pieces = "".join(g.text[a:b] for a, b in spans)
    assert pieces == "".join(g.text[len(prompt) :].split())
    words = r.to_words()
    assert words.generated_from is not None and not any(words.generated[: words.generated_from])


@pytest.mark.slow
def test_gpt2_bpe_attends_over_the_ids_generate_chose(tiny_gpt2_bpe_path) -> None:
    lm = mhsa.load_model(tiny_gpt2_bpe_path, device="cpu")
    _check_generation(lm, PROMPT, 8, types=True)


@pytest.mark.slow
def test_gpt2_bpe_attention_is_the_models_own_over_those_ids(tiny_gpt2_bpe_path) -> None:
    lm = mhsa.load_model(tiny_gpt2_bpe_path, device="cpu")
    g = mhsa.engine.generate_ids(PROMPT, model=lm, max_new_tokens=6)
    r = mhsa.engine.attend_generated(g, model=lm)
    with torch.no_grad():
        out = lm.head_model(torch.tensor([g.ids]), output_attentions=True)
    theirs = torch.stack([a[0] for a in out.attentions]).numpy()
    np.testing.assert_allclose(r.attention, theirs, atol=1e-5)


def test_wordpiece_gpt2_keeps_prompt_plus_generated_tokens(tiny_gpt2_path) -> None:
    """The bug's case: re-tokenizing the decoded text merged the continuation with the
    prompt's last word; the ids path keeps prompt + 8 tokens."""
    lm = mhsa.load_model(tiny_gpt2_path, device="cpu")
    _check_generation(lm, PROMPT, 8, types=True)
    g = mhsa.engine.generate_ids(PROMPT, model=lm, max_new_tokens=8)
    r = mhsa.engine.attend_generated(g, model=lm)
    assert r.num_tokens == g.prompt_tokens + 8
    # the first generated word is a word of its own, however the text glues it on
    first = next(i for i in range(g.prompt_tokens, r.num_tokens) if not r.special[i])
    assert r.word_ids[first] > max(r.word_ids[: g.prompt_tokens])


def test_llama_with_token_type_ids_generates(tiny_llama_path) -> None:
    """A saved BERT tokenizer returns token_type_ids, which a Llama forward does not take."""
    lm = mhsa.load_model(tiny_llama_path, device="cpu")
    assert "token_type_ids" in lm.tokenizer(PROMPT)
    _check_generation(lm, PROMPT, 5, types=False)


def test_word_level_toy_llama_attends_over_the_ids_generate_chose() -> None:
    lm = mhsa.load_model("toy:copy", device="cpu")
    _check_generation(lm, "ba ke mo di [SEP]", 4, types=False)


def test_attend_generated_refuses_another_tokenizers_ids(tiny_gpt2_path) -> None:
    lm = mhsa.engine.get_model(tiny_gpt2_path, "cpu")
    wrong = mhsa.engine.Generation(PROMPT, (1, 2, 3, 4), 2, PROMPT + " x")
    with pytest.raises(mhsa.InputError, match="another tokenizer"):
        mhsa.engine.attend_generated(wrong, model=lm)


def test_a_cut_generation_keeps_the_first_tokens_and_counts_the_rest(tiny_gpt2_path) -> None:
    lm = mhsa.engine.get_model(tiny_gpt2_path, "cpu")
    g = mhsa.engine.generate_ids(PROMPT, model=lm, max_new_tokens=8)
    r = mhsa.engine.attend_generated(g, model=lm, max_tokens=g.prompt_tokens + 3)
    assert r.tokens == lm.tokenizer.convert_ids_to_tokens(list(g.ids[: g.prompt_tokens + 3]))
    assert r.truncated_tokens == len(g.ids) - g.prompt_tokens - 3
    assert r.generated.count(True) == 3


def test_the_walkthrough_runs_over_the_generated_ids(tiny_gpt2_path) -> None:
    from mhsa.analysis.classroom import walkthrough

    lm = mhsa.engine.get_model(tiny_gpt2_path, "cpu")
    g = mhsa.engine.generate_ids(PROMPT, model=lm, max_new_tokens=8)
    walk = walkthrough(g, model=lm, layer=0)
    assert walk.tokens == lm.tokenizer.convert_ids_to_tokens(list(g.ids))


def test_knock_outs_run_over_the_generated_ids(tiny_gpt2_path) -> None:
    """``ablate`` on a Generation scores the ids the model chose: its intact next-token loss is
    the plain model's loss over exactly those ids (the decoded text tokenized again is another
    sequence here: 17 tokens instead of 13)."""
    lm = mhsa.engine.get_model(tiny_gpt2_path, "cpu")
    g = mhsa.engine.generate_ids(PROMPT, model=lm, max_new_tokens=8)
    assert len(lm.tokenizer(g.text)["input_ids"]) != len(g.ids)  # the bug's setting
    a = mhsa.ablate(g, ["L1H2"], model=lm, target="lm-loss")
    ids = torch.tensor([g.ids])
    with torch.no_grad():  # one segment, as generate extended the prompt's token types
        theirs = lm.head_model(ids, token_type_ids=torch.zeros_like(ids), labels=ids).loss.item()
    assert a.intact_value == pytest.approx(theirs, abs=1e-5)
    assert a.ablated_value != pytest.approx(theirs, abs=1e-6)
    assert a.intact.tokens == lm.tokenizer.convert_ids_to_tokens(list(g.ids))
    assert a.intact.text == g.text


def test_head_importance_runs_over_the_generated_ids(tiny_gpt2_path) -> None:
    """Leave-one-out importance on a Generation is each head's knock-out on those ids."""
    lm = mhsa.engine.get_model(tiny_gpt2_path, "cpu")
    g = mhsa.engine.generate_ids(PROMPT, model=lm, max_new_tokens=8)
    table = mhsa.causal.head_importance([g], model=lm, target="lm-loss")
    for label in ("L0H1", "L1H3"):
        one = mhsa.ablate(g, [label], model=lm, target="lm-loss")
        assert table.loc[label, "importance"] == pytest.approx(one.change, abs=1e-5)
    retokenized = mhsa.causal.head_importance([g.text], model=lm, target="lm-loss")
    assert not np.allclose(table["importance"], retokenized["importance"], atol=1e-4)


def _sentencepiece_tokenizer():
    """A Llama-2 style tokenizer (SentencePiece's ``▁`` word marks, a decoder that strips the
    first space of what it decodes), built offline from a small vocabulary."""
    from transformers import LlamaTokenizer

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *"▁abcdefghijklmnopqrstuvwxyz."])}
    merges = []
    for a, b in [("▁", "t"), ("▁t", "h"), ("▁th", "e"), ("▁", "c"), ("a", "t"), ("▁c", "at")]:
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    return LlamaTokenizer(vocab=vocab, merges=merges)


@pytest.fixture(scope="module")
def tiny_sentencepiece_llama(tmp_path_factory: pytest.TempPathFactory) -> mhsa.engine.LoadedModel:
    """A tiny random Llama with that tokenizer whose greedy continuation of ``the cat.`` starts
    with a word (a ``▁`` token): the seed is the first one that does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _sentencepiece_tokenizer()
    sizes = {**DECODER_SIZES, "vocab_size": len(tok)}
    for seed in range(50):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**sizes, bos_token_id=1, eos_token_id=2))
        ids = tok("the cat.", return_tensors="pt")["input_ids"]
        with torch.no_grad():
            first = model(input_ids=ids).logits[0, -1].argmax().item()
        if tok.convert_ids_to_tokens(first).startswith("▁"):
            break
    folder = tmp_path_factory.mktemp("llama-sp")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return mhsa.load_model(str(folder), device="cpu")


def test_sentencepiece_generation_keeps_the_space_before_the_continuation(
    tiny_sentencepiece_llama,
) -> None:
    """Prompt + continuation is the tokenizer's decoding of every id ``generate`` returned, as
    transformers' text-generation pipeline took it up to 4.x (``prompt_length =
    len(decode(input_ids))``, then the rest of ``decode(sequence)``): the space before the first
    generated word stays. Decoding the continuation alone (the pinned 5.x pipeline does) loses
    it with a SentencePiece tokenizer."""
    lm, prompt = tiny_sentencepiece_llama, "the cat."
    out = lm.head_model.generate(
        **lm.tokenizer(prompt, return_tensors="pt"), max_new_tokens=4, do_sample=False
    )
    expected = lm.tokenizer.decode(out[0], skip_special_tokens=True)
    assert expected.startswith(prompt)  # the prompt decodes back to itself
    g = mhsa.engine.generate_ids(prompt, model=lm, max_new_tokens=4)
    assert list(g.ids) == out[0].tolist()
    alone = lm.tokenizer.decode(list(g.new_ids), skip_special_tokens=True)
    assert expected != prompt + alone  # the slip this test holds: alone, the space is lost
    assert expected[len(prompt)] == " "
    assert g.text == expected
    assert mhsa.engine.generate(prompt, model=lm, max_new_tokens=4) == expected
    r = mhsa.engine.attend_generated(g, model=lm)
    spans = [g.text[a:b] for (a, b), gen in zip(r.offsets, r.generated, strict=True) if gen]
    assert "".join(spans) == "".join(g.text[len(prompt) :].split())
