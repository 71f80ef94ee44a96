"""Head roles (mhsa.analysis.roles) against hand computations: TransformerLens's detection
definitions
written out as loops, sinks counted by hand, composition from the model's own full matrices."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import mhsa
from mhsa.analysis import repeats, roles
from tests.tiny import hand_result

TOY = Path(__file__).resolve().parent.parent / "data" / "toy" / "induction"
SENTENCES = [
    "The cat sat on the mat.",
    "Dogs bark at night when the moon is full.",
    "She sells sea shells by the sea shore.",
]


# --- hand-written references ----------------------------------------------------------------------


def _tl_score(a: np.ndarray, p: np.ndarray, exclude_bos: bool, exclude_current: bool, measure: str):
    """compute_head_attention_similarity_score (transformer_lens/head_detector.py), element by
    element on copies."""
    n = len(a)
    a = a.astype(np.float64).copy()
    if measure == "mul":
        for i in range(n):
            if exclude_bos:
                a[i][0] = 0.0
            if exclude_current:
                a[i][i] = 0.0
        hit = sum(a[i][j] * p[i][j] for i in range(n) for j in range(n))
        return hit / sum(a[i][j] for i in range(n) for j in range(n))
    diff = [[abs(a[i][j] - p[i][j]) for j in range(n)] for i in range(n)]
    for i in range(n):
        if exclude_bos:
            diff[i][0] = 0.0
        if exclude_current:
            diff[i][i] = 0.0
    mean = sum(sum(row) for row in diff) / (n * n)
    return 1 - round(mean * n, 3)


def _causal_attention(rng: np.random.Generator, layers: int, heads: int, n: int) -> np.ndarray:
    raw = rng.random((layers, heads, n, n)) * np.tril(np.ones((n, n)))
    return (raw / raw.sum(-1, keepdims=True)).astype(np.float32)


# --- detection patterns ---------------------------------------------------------------------------


def test_patterns_built_from_token_ids():
    ids = [5, 7, 5, 9, 7, 5]
    prev = roles.detection_pattern("previous token", ids)
    dup = roles.detection_pattern("duplicate token", ids)
    ind = roles.detection_pattern("induction", ids)
    assert {tuple(x) for x in np.argwhere(prev)} == {(i, i - 1) for i in range(1, 6)}
    # token 5 at 0, 2, 5; token 7 at 1, 4: earlier occurrences only
    assert {tuple(x) for x in np.argwhere(dup)} == {(2, 0), (4, 1), (5, 0), (5, 2)}
    # the key after an earlier occurrence: 5 at 2 -> key 1; 7 at 4 -> key 2; 5 at 5 -> 1, 3
    assert {tuple(x) for x in np.argwhere(ind)} == {(2, 1), (4, 2), (5, 1), (5, 3)}
    assert roles.detection_pattern("induction_head", ids).tolist() == ind.tolist()  # TL's name


def test_induction_pattern_keeps_the_diagonal_after_a_repeat():
    # TransformerLens's roll puts (i, i) on the pattern when token i-1 equals token i
    ind = roles.detection_pattern("induction", [4, 4, 8])
    assert ind[1, 1] == 1.0 and ind.sum() == 1.0


# --- scores against loops -------------------------------------------------------------------------


@pytest.mark.parametrize("measure", ["mul", "abs"])
@pytest.mark.parametrize("exclude_bos", [False, True])
@pytest.mark.parametrize("exclude_current", [False, True])
def test_scores_equal_the_definition_written_as_a_loop(measure, exclude_bos, exclude_current):
    rng = np.random.default_rng(7)
    attention = _causal_attention(rng, 2, 3, 6)
    attention.setflags(write=False)  # a cached result: any write raises
    kept = attention.copy()
    pattern = roles.detection_pattern("duplicate token", [1, 2, 1, 3, 2, 1])
    got = roles.detection_scores(
        attention,
        pattern,
        exclude_bos=exclude_bos,
        exclude_current_token=exclude_current,
        error_measure=measure,
    )
    want = [
        [
            _tl_score(attention[li, h], pattern, exclude_bos, exclude_current, measure)
            for h in range(3)
        ]
        for li in range(2)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    assert np.array_equal(attention, kept)


def test_scores_of_a_near_perfect_previous_token_head():
    pattern = roles.detection_pattern("previous token", range(5))
    exact = pattern.copy()
    exact[0, 0] = 1.0  # the first query has no previous token: it looks at itself
    attention = exact[None, None].astype(np.float32)
    # abs: one cell off by 1, mean over 25 cells times 5 = 0.2; mul: 4 of 5 rows on the pattern
    assert roles.detection_scores(attention, pattern, error_measure="abs")[0, 0] == 0.8
    assert roles.detection_scores(attention, pattern, error_measure="abs", exclude_bos=True)[
        0, 0
    ] == pytest.approx(1.0)
    assert roles.detection_scores(attention, pattern)[0, 0] == pytest.approx(4 / 5)


def test_bad_patterns_and_measures_say_what_is_wrong():
    attention = _causal_attention(np.random.default_rng(0), 1, 1, 4)
    with pytest.raises(mhsa.InputError, match=r"\[4, 4\], got \[3, 3\]"):
        roles.detection_scores(attention, np.eye(3))
    with pytest.raises(mhsa.InputError, match="lower triangular"):
        roles.detection_scores(attention, np.triu(np.ones((4, 4))))
    with pytest.raises(mhsa.InputError, match="error_measure 'squared'"):
        roles.detection_scores(attention, np.eye(4), error_measure="squared")
    with pytest.raises(mhsa.InputError, match="at least two tokens"):
        roles.detection_scores(attention[..., :1, :1], np.eye(1))
    with pytest.raises(mhsa.InputError, match=r"'previous'.*previous token"):
        roles.detection_pattern("previous", [1, 2])
    with pytest.warns(UserWarning, match="other than 0 or 1"):
        roles.detection_scores(attention, np.tril(np.full((4, 4), 0.5)))


# --- on MiniLM ------------------------------------------------------------------------------------


def test_previous_token_scores_on_minilm_match_a_loop_over_results(minilm):
    got = roles.detect_heads(SENTENCES, "previous token", model=minilm)
    per_text = []
    for text in SENTENCES:
        r = mhsa.attend(text, model=minilm)
        n = r.num_tokens
        per_text.append(
            [
                sum(float(r.attention[li, h, i, i - 1]) for i in range(1, n))
                / float(r.attention[li, h].sum())
                for li in range(r.num_layers)
                for h in range(r.num_heads)
            ]
        )
    want = np.mean(per_text, axis=0)
    assert list(got.index[:3]) == ["L0H0", "L0H1", "L0H2"] and len(got) == 72
    np.testing.assert_allclose(got["score"].to_numpy(), want, atol=1e-5)
    # MiniLM has a previous-token head: most of its attention on the token before
    assert got["score"].max() > 0.6 > got["score"].median() * 3


def test_both_engines_give_the_same_scores(minilm):
    ours = roles.detect_heads(SENTENCES[:2], "duplicate token", model=minilm, engine="mhsa")
    theirs = roles.detect_heads(SENTENCES[:2], "duplicate token", model=minilm)
    np.testing.assert_allclose(ours["score"], theirs["score"], atol=1e-5)


def test_random_token_test_through_both_engines(minilm):
    ours = roles.induction_scores(minilm, engine="mhsa", length=6, count=2, seed=1)
    theirs = roles.induction_scores(minilm, length=6, count=2, seed=1)
    assert ours.shape == (6, 12)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_encoder_decoder_models_score_their_encoder(tiny_t5_path):
    t5 = mhsa.load_model(tiny_t5_path, device="cpu")
    text = "the cat and the dog"
    got = roles.detect_heads(text, "duplicate token", model=t5)
    r = mhsa.attend(text, model=t5)
    ids = t5.tokenizer(text)["input_ids"]
    want = [
        sum(
            float(r.attention[li, h, i, j])
            for i in range(len(ids))
            for j in range(i)
            if ids[i] == ids[j]
        )
        / float(r.attention[li, h].sum())
        for li in range(r.num_layers)
        for h in range(r.num_heads)
    ]
    assert max(want) > 0  # "the" comes twice
    np.testing.assert_allclose(got["score"].to_numpy(), want, atol=1e-6)


def test_minilm_input_errors(minilm):
    with pytest.raises(mhsa.InputError, match="causal"):
        roles.detect_heads(SENTENCES[:1], "previous token", model=minilm, error_measure="abs")
    with pytest.raises(mhsa.InputError, match="one text"):
        roles.detect_heads(SENTENCES[:2], np.eye(9), model=minilm)
    with pytest.raises(mhsa.InputError, match=r"9 tokens, so \[9, 9\]"):
        roles.detect_heads(SENTENCES[:1], np.eye(4), model=minilm)  # [CLS] 7 tokens [SEP]
    with pytest.raises(mhsa.InputError, match="Unknown detection pattern 'copy'"):
        roles.detect_heads(SENTENCES[:1], "copy", model=minilm)
    with pytest.raises(mhsa.InputError, match="text 2 is empty"):
        roles.detect_heads(["A cat.", "  "], "induction", model=minilm)
    with pytest.raises(mhsa.InputError, match="pattern='induction'"):
        roles.detect_heads(None, "previous token", model=minilm)


def test_custom_array_pattern_for_one_text(minilm):
    text = SENTENCES[0]
    r = mhsa.attend(text, model=minilm)
    pattern = np.zeros((r.num_tokens, r.num_tokens))
    pattern[:, 0] = 1.0  # everything on [CLS]
    got = roles.detect_heads(text, pattern, model=minilm)
    want = r.attention[..., 0].sum(-1) / r.attention.sum((-2, -1))
    np.testing.assert_allclose(got["score"].to_numpy(), want.reshape(-1), atol=1e-5)


def test_forward_pattern_on_minilm_scores_attention_to_the_next_token(minilm):
    # bidirectional: any square pattern scores, "mul" on the full matrix
    per_text, scores = [], []
    for text in SENTENCES:
        r = mhsa.attend(text, model=minilm)
        n = r.num_tokens
        scores.append(roles.detect_heads(text, np.eye(n, k=1), model=minilm)["score"].to_numpy())
        per_text.append(
            [
                sum(float(r.attention[li, h, i, i + 1]) for i in range(n - 1))
                / float(r.attention[li, h].sum())
                for li in range(r.num_layers)
                for h in range(r.num_heads)
            ]
        )
    np.testing.assert_allclose(np.mean(scores, axis=0), np.mean(per_text, axis=0), atol=1e-5)
    assert max(np.mean(per_text, axis=0)) > 0.3  # some head does look at the next token


# --- one-token texts: a tokenizer that adds no special tokens -------------------------------------


@pytest.fixture(scope="module")
def bare_gpt2(tmp_path_factory) -> mhsa.engine.LoadedModel:
    """A tiny GPT-2 whose word-level tokenizer adds nothing, so that "hello" is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ["[UNK]", "hello", "world", "the", "cat"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder = tmp_path_factory.mktemp("bare-gpt2")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(words), n_positions=16, n_embd=16, n_layer=2, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]").save_pretrained(folder)
    return mhsa.load_model(str(folder), device="cpu")


def test_a_one_token_text_is_refused_by_name(bare_gpt2):
    with pytest.raises(mhsa.InputError, match=r"Text 2 \('hello'\) gives 1 token"):
        roles.detect_heads(["hello world", "hello"], "previous token", model=bare_gpt2)


def test_abs_on_a_causal_model_matches_the_loop(bare_gpt2):
    text = "the cat the cat hello"
    got = roles.detect_heads(
        text, "induction", model=bare_gpt2, error_measure="abs", exclude_bos=True
    )
    r = mhsa.attend(text, model=bare_gpt2)
    pattern = roles.detection_pattern("induction", [3, 4, 3, 4, 1])
    want = [
        _tl_score(r.attention[li, h], pattern, True, False, "abs")
        for li in range(2)
        for h in range(2)
    ]
    np.testing.assert_allclose(got["score"].to_numpy(), want, atol=1e-9)


def test_a_pattern_above_the_diagonal_is_refused_for_a_causal_model(bare_gpt2):
    forward = np.eye(5, k=1)
    with pytest.raises(mhsa.InputError, match="lower triangular for this causal model") as e:
        roles.detect_heads("the cat the cat hello", forward, model=bare_gpt2)
    assert "never attends to later tokens" in str(e.value)


# --- the random-token induction test --------------------------------------------------------------


def test_random_token_induction_score_is_the_demo_diagonal(bare_gpt2):
    length, count = 5, 3
    got = roles.induction_scores(bare_gpt2, length=length, count=count, seed=4)
    ids = repeats.random_repeats(bare_gpt2, length, count, seed=4)
    assert torch.equal(ids[:, :length], ids[:, length:]) and 0 not in ids  # [UNK] left out
    with torch.no_grad():
        att = bare_gpt2.model(input_ids=ids, output_attentions=True).attentions
    want = np.zeros((2, 2))
    for li in range(2):
        for h in range(2):
            stripe = [
                float(att[li][b, h, i, i - length + 1])
                for b in range(count)
                for i in range(length - 1, 2 * length)
            ]
            want[li, h] = sum(stripe) / len(stripe)
    np.testing.assert_allclose(got, want, atol=1e-6)
    frame = roles.detect_heads(None, model=bare_gpt2, seed=4, repeat_length=length)
    assert frame.shape == (4, 1)  # ten sequences by default: other numbers, same shape
    with pytest.raises(mhsa.InputError, match="length from 2 to 8"):
        roles.induction_scores(bare_gpt2, length=9)


def test_the_repeated_tokens_result_is_the_tests_first_sequence(bare_gpt2) -> None:
    """What the test's figures show: the first of the test's sequences (the same ids), its
    attention as the plain model computes it, and its induction pattern on the stripe the
    score reads."""
    length = 6
    result, ids = repeats.repeated_tokens(bare_gpt2, seed=4, length=length)
    first = repeats.random_repeats(bare_gpt2, length, 3, seed=4)[0]
    assert ids == first.tolist() and ids[:length] == ids[length:]
    assert result.tokens == bare_gpt2.tokenizer.convert_ids_to_tokens(ids)
    with torch.no_grad():
        att = bare_gpt2.model(input_ids=first[None], output_attentions=True).attentions
    np.testing.assert_allclose(result.attention, torch.cat(att).numpy(), atol=1e-6)
    assert result.causal and result.attention.shape == (2, 2, 2 * length, 2 * length)
    pattern = roles.detection_pattern("induction", ids)
    for i in range(length, 2 * length):  # each repeated token: the key after its first copy
        assert pattern[i, i - length + 1] == 1
    with pytest.raises(mhsa.InputError, match="length from 2 to 8"):
        repeats.repeated_tokens(bare_gpt2, length=9)


# --- attention sinks ------------------------------------------------------------------------------


def _result(attention: np.ndarray, tokens: list[str], **fields) -> mhsa.AttentionResult:
    return hand_result(attention, tokens, model="hand", **fields)


def test_a_causal_models_sinks_count_the_queries_at_or_after_each_key_where_enough_can():
    sinking = [  # all on the first token
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [0.9, 0.1, 0.0, 0.0, 0.0],
        [0.8, 0.1, 0.1, 0.0, 0.0],
        [0.7, 0.1, 0.1, 0.1, 0.0],
        [0.6, 0.1, 0.1, 0.1, 0.1],
    ]
    spread = [
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0, 0.0],
        [0.2, 0.6, 0.2, 0.0, 0.0],
        [0.1, 0.5, 0.2, 0.2, 0.0],
        [0.1, 0.1, 0.1, 0.1, 0.6],  # the last key: one query's weight on itself, 0.6
    ]
    tokens = ["a", "b", "c", "d", "e"]
    s = roles.attention_sinks(_result(np.array([[sinking, spread]]), tokens, causal=True))
    table = s.table.set_index(["head", "position"])
    # L0H0: key 0 gets (1 + 0.9 + 0.8 + 0.7 + 0.6) / 5 from 5 queries; key 1 (0.1 * 4) / 4
    assert table.loc[("L0H0", 0), "received"] == pytest.approx(0.8)
    assert table.loc[("L0H0", 1), "received"] == pytest.approx(0.1)
    assert table.loc[("L0H1", 0), "received"] == pytest.approx(1.9 / 5)
    assert table.loc[("L0H1", 1), "received"] == pytest.approx(1.7 / 4)
    assert table["queries"].tolist() == [5, 4, 3, 2, 1] * 2
    # keys 2 to 4: fewer than SINK_MIN_QUERIES (4) queries can attend them: not measured
    assert roles.SINK_MIN_QUERIES == 4
    assert table.loc[("L0H1", 4), "received"] != table.loc[("L0H1", 4), "received"]  # NaN
    assert table.loc[("L0H1", 2), "token"] == "c"
    assert table[table["sink"]].index.tolist() == [("L0H0", 0), ("L0H1", 0), ("L0H1", 1)]
    assert (s.share, s.first_share, s.causal) == (1.0, 1.0, True)
    strict = roles.attention_sinks(_result(np.array([[sinking, spread]]), tokens, causal=True), 0.5)
    assert (strict.share, strict.first_share) == (0.5, 0.5)
    with pytest.raises(mhsa.InputError, match="threshold"):
        roles.attention_sinks(_result(np.array([[sinking]]), tokens), 1.5)


def test_an_encoders_sinks_are_the_mean_over_every_query():
    """Every query attends every key: the last key's mean is over all of them, not over the
    last query alone (which put a sink on the last token of most encoder heads)."""
    head = np.array(
        [
            [0.1, 0.1, 0.8],
            [0.2, 0.6, 0.2],
            [0.3, 0.6, 0.1],
        ]
    )
    s = roles.attention_sinks(_result(head[None, None], ["a", "b", "c"]))
    received = s.table["received"].tolist()
    for j in range(3):  # by hand: the column's mean over the three queries
        assert received[j] == pytest.approx(sum(head[i, j] for i in range(3)) / 3)
    assert s.table["sink"].tolist() == [False, True, True]  # 0.2, 0.433, 0.367
    assert s.table["queries"].tolist() == [3, 3, 3] and not s.causal


def test_minilm_sinks_on_cls(minilm):
    r = mhsa.attend(SENTENCES[0], model=minilm)
    s = roles.attention_sinks(r)
    cls = r.attention[..., 0].mean(-1)  # every query is at or after [CLS]
    assert s.first_share == pytest.approx(float((cls > 0.3).mean()))
    assert len(s.table) == 72 * r.num_tokens and s.first_share > 0.5


def test_sink_value_norms_are_the_norms_over_the_attention(minilm):
    r = mhsa.attend(SENTENCES[0], model=minilm, norms=True)
    table = roles.sink_value_norms(r)
    sinks = roles.attention_sinks(r).table
    assert table[["head", "position"]].values.tolist() == (
        sinks[sinks["sink"]][["head", "position"]].values.tolist()
    )
    row = table.iloc[0]
    layer, head = mhsa.parse_head_label(row["head"])
    j = int(row["position"])
    # alpha_ij * ||f(x_j)|| / alpha_ij for any query i: the last query, by hand
    by_hand = float(r.norms[layer, head, -1, j]) / float(r.attention[layer, head, -1, j])
    assert row["value_norm"] == pytest.approx(by_hand, rel=1e-4)
    every = [
        float(r.norms[layer, head, -1, k]) / float(r.attention[layer, head, -1, k])
        for k in range(r.num_tokens)
    ]
    assert row["median_value_norm"] == pytest.approx(float(np.median(every)), rel=1e-4)
    assert row["ratio"] == pytest.approx(by_hand / float(np.median(every)), rel=1e-4)
    assert row["token"] == r.tokens[j]
    with pytest.raises(mhsa.InputError, match="norms=True"):
        roles.sink_value_norms(mhsa.attend(SENTENCES[0], model=minilm))


# --- head composition -----------------------------------------------------------------------------


def _full_matrices(lm: mhsa.engine.LoadedModel) -> tuple[list, list]:
    """Per layer, [H] OV and QK ``[D, D]`` matrices from the Llama model's own weights (row
    vectors, as TransformerLens writes them)."""
    ovs, qks = [], []
    cfg = lm.config
    h, g = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = cfg.hidden_size // h
    for layer in lm.model.layers:
        att = layer.self_attn
        wq, wk, wv, wo = (
            m.weight.detach().double() for m in (att.q_proj, att.k_proj, att.v_proj, att.o_proj)
        )
        ov, qk = [], []
        for head in range(h):
            kv = head // (h // g)
            q = wq[head * dh : (head + 1) * dh].T  # (D, Dh)
            k = wk[kv * dh : (kv + 1) * dh].T
            v = wv[kv * dh : (kv + 1) * dh].T
            o = wo[:, head * dh : (head + 1) * dh].T  # (Dh, D)
            ov.append(v @ o)
            qk.append(q @ k.T)
        ovs.append(ov)
        qks.append(qk)
    return ovs, qks


def test_composition_equals_the_full_matrix_norms(tiny_llama_path):
    lm = mhsa.load_model(tiny_llama_path, device="cpu")  # grouped-query: 4 heads, 2 K/V
    ovs, qks = _full_matrices(lm)
    reading = {
        "Q": lambda layer, h: qks[layer][h],
        "K": lambda layer, h: qks[layer][h].T,
        "V": lambda layer, h: ovs[layer][h],
    }
    for kind, read in reading.items():
        got = roles.head_composition(lm, kind)
        assert got.shape == (8, 8)
        for a in range(4):
            for b in range(4):
                left, right = ovs[0][a], read(1, b)
                want = torch.linalg.norm(left @ right) / (
                    torch.linalg.norm(left) * torch.linalg.norm(right)
                )
                assert got.loc[f"L0H{a}", f"L1H{b}"] == pytest.approx(float(want), rel=1e-9)
        # no head reads from its own layer or a later one (TransformerLens's mask)
        assert (got.loc["L1H0":, :] == 0).all().all() and (got.loc[:, :"L0H3"] == 0).all().all()
    with pytest.raises(mhsa.InputError, match="Q, K, V"):
        roles.head_composition(lm, "O")


def test_strongest_inputs_ranks_earlier_heads(tiny_llama_path):
    scores = roles.head_composition(mhsa.load_model(tiny_llama_path, device="cpu"), "V")
    top = roles.strongest_inputs(scores, "L1H2", top=3)
    column = scores["L1H2"].loc["L0H0":"L0H3"].sort_values(ascending=False)
    assert top.index.tolist() == column.index[:3].tolist()
    assert top["score"].tolist() == column.iloc[:3].tolist()
    assert roles.strongest_inputs(scores, "L0H1").empty  # the first layer reads no head
    with pytest.raises(mhsa.InputError, match="L<layer>H<head>"):
        roles.strongest_inputs(scores, "head 3")
    with pytest.raises(mhsa.InputError, match="L7H0 is not a head"):
        roles.strongest_inputs(scores, "L7H0")


# --- the toy induction model ----------------------------------------------------------------------


@pytest.mark.skipif(not TOY.is_dir(), reason="the toy induction model is not in data/toy")
def test_toy_previous_token_head_feeds_the_induction_head_through_keys():
    toy = mhsa.load_model(str(TOY), device="cpu")
    symbols = [w for w in toy.tokenizer.get_vocab() if not w.startswith("[")]
    rng = np.random.default_rng(0)
    texts = []
    for _ in range(8):  # as the model was trained: distinct symbols, then the same again
        half = list(rng.choice(symbols, size=12, replace=False))
        texts.append(" ".join(half + half))
    prev = roles.detect_heads(texts, "previous token", model=toy)["score"]
    induction = roles.detect_heads(texts, "induction", model=toy)["score"]
    prev_head = prev.loc["L0H0":"L0H3"].idxmax()
    induction_head = induction.loc["L1H0":"L1H3"].idxmax()
    assert induction[induction_head] > 0.3 > induction.loc["L0H0":"L0H3"].max()
    k = roles.head_composition(toy, "K")
    into = roles.strongest_inputs(k, induction_head)["score"]
    assert into.index[0] == prev_head
    assert into.iloc[0] > 1.15 * into.iloc[1]  # clearly above the other layer-0 heads
    # and through keys, not queries or values
    q, v = roles.head_composition(toy, "Q"), roles.head_composition(toy, "V")
    assert into.iloc[0] > 2 * max(
        q.loc[prev_head, induction_head], v.loc[prev_head, induction_head]
    )
