"""The README's and docs' claims about what a page or the library shows, each with a number or a
ranking, computed here: every test quotes its sentence, reads the number out of the document
and computes it another way (transformers' own forward and weights, a plain loop over the
corpus, counting by hand), so a document cannot keep a number the code no longer gives.

The inventory (each document's sentence with a number or a ranking, and where it is checked):

- README: MiniLM is "6 layers x 12 heads"; ``r.attention.shape`` of "The cat sat on the mat."
  is ``(6, 12, 9, 9)``; ``toy:induction-long`` "reads 2,048 positions"; "five short lessons":
  here. The Circuits example's edge rank (docs/pages.md): ``tests/app/test_circuits_page.py``.
- docs/pages.md, weighted by value norm: the [CLS]/[SEP] shares by weights and by norms, per
  layer and overall, the uniform share, "it falls in all 72 heads", the value norms they carry:
  here, from transformers' hidden states and the layers' own value and output weights.
- docs/pages.md, Line view: "Beyond 40 tokens each token keeps its 5 strongest lines": here, on
  the figure. Attention sinks' "more than 0.3" of the attention "where at least four can":
  here, on attention written by hand.
- docs/corpus.md: the role counts, the positional heads, the per-layer means, the head
  similarity's extremes and the importance ranking over ``data/sentences.txt``: here (slow),
  one sentence at a time where the report batches the corpus.
- README, "every page counts a sentence's unknown tokens" and "``?presentation=1`` enlarges
  every font": ``tests/app/test_views_page.py`` (Compare's second sentence),
  ``tests/app/test_patching_page.py`` / ``test_circuits_page.py`` (their toy examples) and the
  presentation browser tests (``tests/browser/test_presentation_browser.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import mhsa

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = (ROOT / "docs" / "pages.md").read_text()
CORPUS = (ROOT / "docs" / "corpus.md").read_text()
NUMBERS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def _one(pattern: str, text: str) -> re.Match:
    found = re.findall(pattern, text)
    assert len(found) == 1, (pattern, found)
    return re.search(pattern, text)  # type: ignore[return-value]


def test_readme_minilm_layers_heads_and_the_cat_sentences_shape() -> None:
    m = _one(r"all-MiniLM-L6-v2 \(BERT, (\d+) layers x (\d+)\s+heads\)", README)
    shape = _one(
        r"r\.attention\.shape, r\.hidden_max_abs_diff  # \((\d+), (\d+), (\d+), (\d+)\)", README
    )
    lm = mhsa.load_model("default")
    config = lm.model.config
    assert (int(m[1]), int(m[2])) == (config.num_hidden_layers, config.num_attention_heads)
    ids = lm.tokenizer("The cat sat on the mat.")["input_ids"]
    n = len(ids)  # [CLS] the cat sat on the mat . [SEP]
    assert tuple(int(shape[i]) for i in range(1, 5)) == (
        config.num_hidden_layers,
        config.num_attention_heads,
        n,
        n,
    )


def test_readme_toy_induction_long_positions() -> None:
    m = _one(r"`toy:induction-long` reads ([\d,]+)\s+positions", README)
    config = mhsa.load_model("toy:induction-long").model.config
    assert int(m[1].replace(",", "")) == config.max_position_embeddings


def test_readme_and_the_lessons_page_count_the_lessons() -> None:
    from ui.lessons import LESSONS

    m = _one(r"Lessons \((\w+) short lessons", README)
    assert NUMBERS[m[1]] == len(LESSONS)
    page = (ROOT / "pages" / "13_Lessons.py").read_text()
    said = _one(r'"(\w+) short lessons, in order', page)
    assert NUMBERS[said[1].lower()] == len(LESSONS)


def _percent(share: float) -> str:
    """A share as the document writes it: ``49.6%``."""
    return f"{100 * share:.1f}%"


def _norm_weighted(text: str, lm) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """By transformers' own forward and weights (Kobayashi et al. 2020): per layer and head,
    the weights ``alpha`` [L, H, n, n], ``alpha_ij ||f_h(x_j)||`` with ``f_h(x) = (x W_V^h +
    b_V^h) W_O^h`` (its slice of the output projection, no output bias), each row scaled to
    sum 1, and the special-token mask."""
    enc = lm.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = lm.model(**enc, output_hidden_states=True, output_attentions=True)
    ids = enc["input_ids"][0].tolist()
    special = np.array([i in lm.tokenizer.all_special_ids for i in ids])
    alphas, weighted, norms = [], [], []
    for layer, block in enumerate(lm.model.encoder.layer):
        x = out.hidden_states[layer][0].double()  # the layer's input, [n, d]
        value, dense = block.attention.self.value, block.attention.output.dense
        heads = block.attention.self.num_attention_heads
        d = x.shape[-1] // heads
        v = (x @ value.weight.double().T + value.bias.double()).reshape(len(ids), heads, d)
        w_o = dense.weight.double().T.reshape(heads, d, -1)  # [H, d_head, d_model]
        f = torch.einsum("nhd,hde->hne", v, w_o)  # [H, n, d_model]
        norm = f.norm(dim=-1).numpy()  # [H, n]
        a = out.attentions[layer][0].double().numpy()  # [H, n, n]
        aw = a * norm[:, None, :]
        alphas.append(a)
        weighted.append(aw / aw.sum(-1, keepdims=True))
        norms.append(norm)
    return np.array(alphas), np.array(weighted), special, np.array(norms)


def test_pages_md_value_norm_shares_of_cls_and_sep() -> None:
    """docs/pages.md: "the weights put **49.6%** of each query's attention on [CLS] and [SEP]
    (... 30.5% in layer 0, 54-60% in layers 1-4, 35.6% in layer 5), while weighted by value
    norm that share falls to **14.6%** (7.1-19.1% per layer), about what uniform attention
    would give (14.2%: each sentence's 2 special tokens over its 9 to 20 tokens, averaged); it
    falls in all 72 heads. ... their mean
    ``||f_h(x_j)||`` is 1.62 against 3.66 for the other tokens"."""
    from bench.bench_norms import SENTENCES

    m = _one(
        r"Over (\w+) everyday sentences\s+\(`python -m bench.bench_norms`\), the weights put "
        r"\*\*([\d.]+%)\*\* of each query's attention on \[CLS\] and\s+\[SEP\] \(mean over "
        r"queries, (\d+) heads and the sentences; ([\d.]+%) in layer 0, (\d+)-(\d+)% in layers "
        r"1-4,\s+([\d.]+%) in layer 5\), while weighted by value norm that share falls to "
        r"\*\*([\d.]+%)\*\* \(([\d.]+)-([\d.]+)% per\s+layer\), about what uniform attention "
        r"would give \(([\d.]+%): each sentence's (\d+) special tokens over\s+its (\d+) to "
        r"(\d+) tokens, averaged\); it falls in all (\d+) heads\. The vectors \[CLS\] and "
        r"\[SEP\] carry are small: their mean "
        r"`\|\|f_h\(x_j\)\|\|` is ([\d.]+)\s+against ([\d.]+) for the other tokens\.",
        PAGES,
    )
    assert NUMBERS[m[1]] == len(SENTENCES)
    lm = mhsa.load_model("default")
    by_weight, by_norm, uniform, lengths, carried = [], [], [], [], []
    for sentence in SENTENCES:
        alpha, weighted, special, norms = _norm_weighted(sentence, lm)
        by_weight.append(alpha[..., special].sum(-1).mean(-1))  # [L, H]
        by_norm.append(weighted[..., special].sum(-1).mean(-1))
        uniform.append(special.mean())
        lengths.append(len(special))
        carried.append((norms[..., special].mean(), norms[..., ~special].mean()))
    weight, norm = np.mean(by_weight, 0), np.mean(by_norm, 0)  # [L, H]
    layers_w, layers_n = weight.mean(1), norm.mean(1)
    assert int(m[3]) == weight.size == int(m[15])
    assert _percent(weight.mean()) == m[2]
    assert (_percent(layers_w[0]), _percent(layers_w[5])) == (m[4], m[7])
    assert int(m[5]) <= 100 * layers_w[1:5].min() and 100 * layers_w[1:5].max() <= int(m[6]) + 0.5
    assert _percent(norm.mean()) == m[8]
    assert (round(100 * layers_n.min(), 1), round(100 * layers_n.max(), 1)) == (
        float(m[9]),
        float(m[10]),
    )
    assert _percent(float(np.mean(uniform))) == m[11]
    assert (int(m[12]), int(m[13]), int(m[14])) == (2, min(lengths), max(lengths))
    assert (norm < weight).all()  # "it falls in all 72 heads"
    special_norm, other_norm = np.mean(carried, 0)
    assert (round(special_norm, 2), round(other_norm, 2)) == (float(m[16]), float(m[17]))


def test_pages_md_line_view_keeps_five_lines_a_token_beyond_forty() -> None:
    """docs/pages.md, Line view: "Beyond 40 tokens each token keeps its 5 strongest lines, and
    the figure says so"."""
    m = _one(r"Beyond (\d+) tokens each token keeps its (\d+) strongest lines", PAGES)
    dense, keep = int(m[1]), int(m[2])
    from mhsa.plots import line_view

    rng = np.random.default_rng(0)
    for n, lines in ((dense, None), (dense + 1, keep)):
        a = rng.random((1, 1, n, n)) + 1e-3
        a /= a.sum(-1, keepdims=True)
        result = mhsa.AttentionResult(
            text="x",
            tokens=[f"t{i}" for i in range(n)],
            attention=a.astype(np.float32),
            offsets=[(0, 0)] * n,
            special=[False] * n,
            punctuation=[False] * n,
            word_ids=list(range(n)),
            model="hand-made",
            engine="test",
            device="cpu",
        )
        fig = line_view(result, 0, heads=[0])
        title = fig.layout.title.text
        if lines is None:
            assert "per token" not in title
        else:
            assert f"top {lines} per token" in title


def test_pages_md_sinks_over_point_three_where_four_queries_can() -> None:
    """docs/pages.md, Head roles: sinks are "the share of heads that give a position more than
    0.3 of the attention of the queries that can attend it ... measured where at least four
    can". A causal head by hand: every query puts 0.31 on token 0 (a sink), the rest spread;
    position n-3 is seen by 3 queries only (not measured), n-4 by 4."""
    m = _one(r"more than ([\d.]+) of the attention of the queries that can attend it", PAGES)
    least = _one(r"measured where at least (\w+) can", PAGES)
    threshold, queries = float(m[1]), NUMBERS[least[1]]
    n = 10
    a = np.zeros((n, n))
    for i in range(n):
        a[i, 0] = 1.0 if i == 0 else threshold + 0.01
        if i:
            a[i, 1 : i + 1] = (1 - a[i, 0]) / i
    result = mhsa.AttentionResult(
        text="x",
        tokens=[f"t{i}" for i in range(n)],
        attention=a[None, None].astype(np.float32),
        offsets=[(0, 0)] * n,
        special=[False] * n,
        punctuation=[False] * n,
        word_ids=list(range(n)),
        model="hand-made",
        engine="test",
        device="cpu",
        causal=True,
    )
    sinks = mhsa.analysis.attention_sinks(result)
    table = sinks.table.set_index("position")
    assert table.at[0, "received"] > threshold and bool(table.at[0, "sink"])
    assert sinks.first_share == 1.0 and sinks.threshold == threshold
    measured = table["received"].notna()
    assert measured[n - queries] and not measured[n - queries + 1]
    assert table.at[n - queries, "queries"] == queries


@pytest.fixture(scope="module")
def corpus_results() -> list[mhsa.AttentionResult]:
    """docs/corpus.md's corpus, one sentence at a time through ``mhsa.attend`` (the report
    runs the batched corpus pipeline)."""
    lines = (ROOT / "data" / "sentences.txt").read_text().splitlines()
    texts = [t for t in lines if t.strip() and not t.startswith("#")]
    m = _one(r"over the (\d+) sentences of `data/sentences.txt` \((\d+) not used\)", CORPUS)
    assert (int(m[1]), int(m[2])) == (len(texts), 0)
    lm = mhsa.load_model("default")
    return [mhsa.attend(t, model=lm) for t in texts]


def _markdown_table(after: str) -> pd.DataFrame:
    """The first markdown table after the heading ``after`` in docs/corpus.md."""
    blocks = CORPUS.split(after, 1)[1].split("\n\n")
    block = next(b.strip() for b in blocks if b.strip().startswith("|"))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()]
    return pd.DataFrame(rows[2:], columns=rows[0])


@pytest.mark.slow
def test_corpus_md_roles_positional_heads_and_layers(corpus_results) -> None:
    """docs/corpus.md: the role counts, "Positional heads (...): 1: L0H2 (-1)" and the
    per-layer means, over the corpus."""
    stats = mhsa.head_stats(corpus_results)
    roles = _markdown_table("## Head roles")
    counted = stats.groupby("role").size()
    assert dict(zip(roles["role"], roles["heads"].astype(int), strict=True)) == counted.to_dict()
    early = stats[stats["layer"] <= 2].groupby("role").size()
    for role, n in zip(roles["role"], roles["of which in layers 0-2"].astype(int), strict=True):
        assert early.get(role, 0) == n, role
    m = _one(r"at least 90% of the tokens\): (\d+): ([^\n]*)\.\n", CORPUS)
    positional = stats[stats["positional"]]
    said = ", ".join(f"{h} ({int(o):+d})" for h, o in positional["positional_offset"].items())
    assert (int(m[1]), m[2]) == (len(positional), said)
    layers = _markdown_table("## Per layer").set_index("layer")
    means = stats.groupby("layer")[list(layers.columns)].mean()
    for layer, row in layers.iterrows():
        for column, value in row.items():
            assert f"{means.at[int(layer), column]:.3f}" == value, (layer, column)


@pytest.mark.slow
def test_corpus_md_most_and_least_alike_heads(corpus_results) -> None:
    """docs/corpus.md: the five most and least alike pairs of heads by Jensen-Shannon
    divergence, mean over sentences."""
    sim = mhsa.head_similarity(corpus_results, metric="js")
    values, labels = sim.to_numpy(), list(sim.index)
    i, j = np.triu_indices_from(values, 1)
    order = np.argsort(values[i, j], kind="stable")
    table = _markdown_table("## Head similarity")
    for k, row in table.iterrows():
        near, far = order[k], order[-1 - k]
        assert row["most alike"] == f"{labels[i[near]]} ~ {labels[j[near]]}"
        assert row["least alike"] == f"{labels[i[far]]} ~ {labels[j[far]]}"
        assert list(row.iloc[[1, 3]]) == [
            f"{values[i[near], j[near]]:.3f}",
            f"{values[i[far], j[far]]:.3f}",
        ]


@pytest.mark.slow
def test_corpus_md_head_importance_ranking(corpus_results) -> None:
    """docs/corpus.md: leave-one-out importance (target ``embedding``) over the corpus, its
    five most and three least important heads, "The ten most important heads: ... (10 of them
    in the last layer)" and Spearman's rho against confidence (by scipy)."""
    from scipy.stats import spearmanr

    texts = [r.text for r in corpus_results]
    importance = mhsa.causal.head_importance(texts, target="embedding")
    ranked = importance["importance"].sort_values(ascending=False, kind="stable")
    table = _markdown_table("## Head importance")
    for _, row in table.iterrows():
        rank = int(row["rank"])
        assert ranked.index[rank - 1] == row["head"], row.to_dict()
        assert f"{ranked.iloc[rank - 1]:.4f}" == row["importance"]
    m = _one(
        r"The ten most important heads: ([^(]+) \((\d+) of them in the last layer\)\. "
        r"Spearman's rho between importance and confidence: ([-+][\d.]+)\.",
        CORPUS,
    )
    top = list(ranked.index[:10])
    assert m[1].split(", ") == top
    assert int(m[2]) == sum(h.startswith("L5") for h in top)
    confidence = mhsa.head_stats(corpus_results)["confidence"]
    rho = spearmanr(importance["importance"], confidence[importance.index]).statistic
    assert f"{rho:+.2f}" == m[3]
