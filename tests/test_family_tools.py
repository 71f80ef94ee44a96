"""Every tool on a tiny random model of every registered family
(``mhsa.engine.families.registry.FAMILIES``),
saved to a folder and opened by path: one parametrised test per tool, so the README's Models
table (``mhsa.engine.families.support``) cannot claim what does not run. A cell the table claims
must give
values checked against an independent computation (the model's own forward, a second code
path); a cell it does not claim must be refused with a message (``MHSAError``), never a
traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import mhsa
from mhsa.engine.families.registry import FAMILIES
from mhsa.engine.families.support import TOOLS, models_table, runs_on
from mhsa.engine.runs.swap import our_blocks, store_our_weights, trainable_our_blocks
from tests.tiny_families import TINY_FAMILIES, check_engine, loaded_tiny

TEXT = "the cat sat on the mat and the dog"
CORRUPTED = "the dog sat on the mat and the bird"
TOL = 1e-4
NAMES = [f.name for f in FAMILIES]
BY_NAME = {f.name: f for f in FAMILIES}
TOOL = {t.name: t for t in TOOLS}
README = Path(__file__).resolve().parents[1] / "README.md"
#: the families whose tiny model's layers feed attention and MLP the same input
PARALLEL = {"GPT-NeoX", "GPT-J", "Phi", "Falcon"}


@pytest.fixture(params=NAMES)
def family(request, tmp_path_factory) -> tuple[str, mhsa.engine.LoadedModel]:
    return request.param, loaded_tiny(request.param, tmp_path_factory.mktemp)


def _claimed(tool: str, name: str) -> bool:
    return runs_on(TOOL[tool], BY_NAME[name])


def _refused(tool: str, name: str, run) -> bool:
    """True when the table does not claim the cell, after checking that it is refused."""
    if _claimed(tool, name):
        return False
    with pytest.raises(mhsa.MHSAError):
        run()
    return True


def _label(lm: mhsa.engine.LoadedModel, layer: int, head: int) -> str:
    return f"{'E' if lm.is_encoder_decoder else 'L'}{layer}H{head}"


def _answers(lm: mhsa.engine.LoadedModel) -> dict[str, str]:
    return {"answer": "cat", "wrong": "dog"} if lm.lm_head == "causal" else {}


def _own_logit_diff(lm: mhsa.engine.LoadedModel, text: str, *, before_cap: bool = False) -> float:
    """logit(cat) - logit(dog) after ``text``, from the model's own forward (``before_cap``:
    the unembedding's output, before a final soft-cap of the logits such as Gemma 2's)."""
    ids = lm.tokenizer(text, return_tensors="pt")
    cat, dog = (lm.tokenizer.convert_tokens_to_ids(w) for w in ("cat", "dog"))
    seen: list[torch.Tensor] = []
    head = lm.head_model.get_output_embeddings()
    handle = head.register_forward_hook(lambda _m, _a, out: seen.append(out))
    try:
        with torch.inference_mode(), lm.lock:
            logits = lm.head_model(**ids).logits[0, -1]
    finally:
        handle.remove()
    if before_cap:
        logits = seen[0][0, -1]
    return float(logits[cat] - logits[dog])


def test_the_readme_table_is_the_generated_one() -> None:
    block = re.search(
        r"<!-- models table: python -m mhsa.engine.families.support -->\n(.*?)"
        r"<!-- end of models table -->",
        README.read_text(),
        re.S,
    )
    assert block is not None and block.group(1) == models_table()


def test_every_family_and_tool_is_tested() -> None:
    assert set(NAMES) <= set(TINY_FAMILIES)  # a tiny model for each registered family
    tested = {name[len("test_") :].replace("_", "-") for name in globals() if name[:5] == "test_"}
    assert {t.name for t in TOOLS} <= tested  # a test per tool of the table


@pytest.mark.slow
def test_engine(family, monkeypatch) -> None:
    """Every layer's attention and the final hidden state equal the model's eager run, while
    the model's own attention forward raises if called (``check_engine``)."""
    _name, lm = family
    check_engine(lm, monkeypatch)


def test_heatmaps(family) -> None:
    _name, lm = family
    result = mhsa.attend(TEXT, model=lm, engine="transformers")
    stats = mhsa.head_stats(result)
    assert len(stats) == result.num_layers * result.num_heads
    np.testing.assert_allclose(result.attention.sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_knock_outs(family) -> None:
    """Head 1 of layer 0 off: the layers above change; where the model calls each block once,
    the model's own forward with that head's slice of W_O zeroed gives the same attention."""
    _name, lm = family
    label = _label(lm, 0, 1)
    ab = mhsa.ablate(TEXT, [label], model=lm)
    own = mhsa.attend(TEXT, model=lm, engine="transformers").attention
    assert np.abs(ab.intact.attention - own).max() <= TOL
    np.testing.assert_array_equal(ab.ablated.attention[0], ab.intact.attention[0])
    assert np.abs(ab.ablated.attention[1] - ab.intact.attention[1]).max() > 1e-6
    with lm.lock:
        shared = len({id(b.original) for b in our_blocks(lm)}) < len(our_blocks(lm))
    if shared:  # ALBERT: zeroing a shared block's W_O would knock the head out in two layers
        return
    copy = mhsa.load_model(lm.name, device="cpu")
    with copy.lock:
        block = trainable_our_blocks(copy)[0]
        d_head = block.ours.d_head
        with torch.no_grad():
            block.ours.out.weight[:, d_head : 2 * d_head] = 0
        store_our_weights([block])
        copy.cache.clear()
    knocked = mhsa.attend(TEXT, model=copy, engine="transformers").attention
    assert np.abs(ab.ablated.attention - knocked).max() <= TOL


@pytest.mark.slow
def test_importance(family) -> None:
    """Leave-one-out importance (batched, layers below replayed) equals a single knock-out's
    change, and pruning starts from the intact value."""
    _name, lm = family
    label = _label(lm, 1, 2)
    importance = mhsa.causal.head_importance(TEXT, model=lm)
    ab = mhsa.ablate(TEXT, [label], model=lm)
    assert importance.loc[label, "importance"] == pytest.approx(ab.change, abs=1e-4)
    curve = mhsa.causal.pruning_curve(TEXT, model=lm, steps=1, importance=importance)
    start = curve[(curve["heads_pruned"] == 0) & (curve["order"] == "importance")]
    assert float(start["metric"].iloc[0]) == pytest.approx(ab.intact_value, abs=1e-4)


@pytest.mark.slow
def test_value_norms(family) -> None:
    name, lm = family

    def run(engine: str) -> mhsa.AttentionResult:
        return mhsa.attend(TEXT, model=lm, engine=engine, norms=True)

    if _refused("value-norms", name, lambda: run("mhsa")):
        return
    ours, theirs = run("mhsa"), run("transformers")  # our module's V, the model's own V
    assert ours.norms is not None and float(ours.norms.max()) > 0
    assert np.abs(ours.norms - theirs.norms).max() <= TOL * max(1.0, float(theirs.norms.max()))


def test_composition(family) -> None:
    """K-composition of L0H0 into L1H1 from the formula (Elhage et al. 2021) on the weights."""
    name, lm = family
    if _refused("composition", name, lambda: mhsa.analysis.head_composition(model=lm, kind="K")):
        return
    scores = mhsa.analysis.head_composition(model=lm, kind="K")
    with lm.lock:
        blocks = our_blocks(lm)
    (_, _, w_v0, w_o0), _ = blocks[0].ours.projections()
    (w_q1, w_k1, _, _), _ = blocks[1].ours.projections()
    a, b = blocks[0].ours, blocks[1].ours
    dh = a.d_head
    g0, g1 = 0 // a.groups, 1 // b.groups
    ov = w_v0[g0 * dh : (g0 + 1) * dh].double().T @ w_o0[:, 0:dh].double().T  # (D, D)
    k1 = w_k1[g1 * dh : (g1 + 1) * dh].double()
    qk = w_q1[dh : 2 * dh].double().T @ k1  # (D, D)
    want = torch.linalg.norm(ov @ qk.T) / (torch.linalg.norm(ov) * torch.linalg.norm(qk))
    assert scores.loc["L0H0", "L1H1"] == pytest.approx(float(want), rel=1e-4)


@pytest.mark.slow
def test_patching(family) -> None:
    """z/q/k/v/pattern: the clean and corrupted metrics are the model's own, one row per head
    (per key/value head for k and v), effects as defined."""
    name, lm = family

    def run(what: str):
        return mhsa.causal.patch_heads(TEXT, CORRUPTED, model=lm, what=what, **_answers(lm))

    if _refused("patching", name, lambda: run("z")):
        return
    with lm.lock:
        ours = our_blocks(lm)[0].ours
    for what in ("z", "q", "k", "v", "pattern"):
        frame = run(what)
        heads = ours.num_kv_heads if what in ("k", "v") else ours.num_heads
        assert len(frame) == len(our_blocks(lm)) * heads
        clean, corrupted = frame.attrs["clean"], frame.attrs["corrupted"]
        if lm.lm_head == "causal":
            assert clean == pytest.approx(_own_logit_diff(lm, TEXT), abs=1e-4)
            assert corrupted == pytest.approx(_own_logit_diff(lm, CORRUPTED), abs=1e-4)
        want = (frame["patched"] - corrupted) / (clean - corrupted)
        np.testing.assert_allclose(frame["effect"], want, rtol=1e-6)


@pytest.mark.slow
def test_attribution_patching(family) -> None:
    _name, lm = family
    frame = mhsa.causal.attribution_patching(TEXT, CORRUPTED, model=lm, **_answers(lm))
    assert np.isfinite(frame.select_dtypes("number").to_numpy()).all()
    assert frame.attrs["clean"] != frame.attrs["corrupted"]
    if lm.lm_head == "causal":
        assert frame.attrs["clean"] == pytest.approx(_own_logit_diff(lm, TEXT), abs=1e-4)


def test_roles(family) -> None:
    """Previous-token scores through our module equal those of the model's own attention."""
    _name, lm = family
    ours = mhsa.detect_heads(TEXT, "previous token", model=lm, engine="mhsa")
    theirs = mhsa.detect_heads(TEXT, "previous token", model=lm, engine="transformers")
    assert len(ours) > 0
    np.testing.assert_allclose(ours["score"], theirs["score"], atol=TOL)


def test_dla(family) -> None:
    """Components sum to the model's own logit difference."""
    name, lm = family

    def run():
        return mhsa.causal.head_attribution(TEXT, model=lm, answer="cat", wrong="dog")

    if _refused("dla", name, run):
        return
    attribution = run()
    assert attribution.total == pytest.approx(attribution.logit_diff, abs=TOL)
    capped = attribution.logit_softcap is not None  # Gemma 2: attributed before its cap
    own = _own_logit_diff(lm, TEXT, before_cap=capped)
    assert attribution.logit_diff == pytest.approx(own, abs=TOL)
    assert np.abs(attribution.heads).max() > 0


def test_logit_lens(family) -> None:
    """The last stage is the model's own prediction at every position."""
    name, lm = family
    if _refused("logit-lens", name, lambda: mhsa.causal.logit_lens(TEXT, model=lm)):
        return
    lens = mhsa.causal.logit_lens(TEXT, model=lm, top_k=1)
    ids = lm.tokenizer(TEXT, return_tensors="pt")
    with torch.inference_mode(), lm.lock:
        top = lm.head_model(**ids).logits[0].argmax(-1)
    want = lm.tokenizer.convert_ids_to_tokens(top.tolist())
    assert list(lens.top_tokens[-1, :, 0]) == want


def test_flow(family) -> None:
    """Each layer's parts (its input, attention and MLP outputs) sum to the layer's output in
    the model's own forward; each block's contributions sum to 1."""
    from mhsa.causal.attribution import residual_pass
    from mhsa.causal.flow import block_contributions

    name, lm = family
    if _refused("flow", name, lambda: mhsa.causal.information_flow(TEXT, model=lm)):
        return
    run = residual_pass(TEXT, model=lm)
    ids = lm.tokenizer(TEXT, return_tensors="pt")
    with torch.inference_mode(), lm.lock:
        hidden = lm.model(**ids, output_hidden_states=True).hidden_states
    for layer in range(run.layers - 1):  # the last hidden state is after the final norm
        parts = run.resid_pre[layer] + run.attn_out[layer] + run.mlp_out[layer]
        torch.testing.assert_close(parts, hidden[layer + 1][0].float(), rtol=0, atol=TOL)
    flow = block_contributions(run)
    total = flow.attention.sum(axis=(2, 3)) + flow.attention_residual
    np.testing.assert_allclose(total, 1.0, atol=1e-5)
    np.testing.assert_allclose(flow.mlp + flow.mlp_residual, 1.0, atol=1e-5)
    # a parallel layer's MLP reads the layer's input: its edge comes from there
    assert run.parallel == (name in PARALLEL,) * run.layers
    graph = mhsa.causal.information_flow(TEXT, model=lm, threshold=0.0)
    into_mlp = [e for e in graph.edges if e.target.kind == "M"]
    assert into_mlp
    for edge in into_mlp:
        assert edge.source.kind == ("IX"[edge.target.layer == 0] if name in PARALLEL else "A")


def test_qk_attribution(family) -> None:
    """The terms of the last layer's head 1 at the last query (an encoder-decoder's last
    decoder self-attention layer, and its cross-attention refused) sum to scores whose softmax
    is the model's own attention (transformers engine) over the keys it may read (a sliding
    window's others are 0; Gemma 2's soft-cap applied)."""
    name, lm = family
    blocks = our_blocks(lm)
    layer = max(b.index for b in blocks)
    head = f"{'D' if lm.is_encoder_decoder else 'L'}{layer}H1"
    if _refused(
        "qk-attribution",
        name,
        lambda: mhsa.analysis.qk_attribution.qk_attribution(TEXT, head, model=lm),
    ):
        return
    terms = mhsa.analysis.qk_attribution.qk_attribution(TEXT, head, model=lm)
    scores = torch.tensor(terms.groupby("key", observed=True)["score"].sum().to_numpy())
    cap = getattr(lm.config, "attn_logit_softcapping", None)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    result = mhsa.attend(TEXT, model=lm, engine="transformers")
    if lm.is_encoder_decoder:
        result = result.of_kind("decoder")
        with pytest.raises(mhsa.UnsupportedModelError, match="cross-attention head"):
            mhsa.analysis.qk_attribution.qk_attribution(TEXT, f"C{layer}H1", model=lm)
    own = result.attention[layer, 1, -1]
    allowed = torch.tensor(own[: len(scores)] > 0)
    windowed = {"Qwen3", "Gemma 2", "Gemma 3 (text)", "Phi-3", "ModernBERT"}
    assert bool(allowed.all()) or name in windowed
    hidden = [k for k, ok in enumerate(allowed.tolist()) if not ok]
    assert terms.attrs["masked_keys"] == hidden  # the window's keys, marked
    ours = torch.softmax(scores[allowed], -1).numpy()
    np.testing.assert_allclose(ours, own[: len(scores)][allowed.numpy()], atol=1e-4)
