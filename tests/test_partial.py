"""Selected layers and heads (``attend(layers=, heads=, attention_dtype=)``,
``mhsa.engine.runs.partial``).

The reference is always the model's own eager forward (``output_attentions=True``, through
``attend``'s ordinary path): the selected weights equal its weights of those layers and heads,
per family, under both engines; the blocks not selected run a fused kernel; the pass stops
after the last selected layer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mhsa
import mhsa.engine.attention.core
from mhsa.engine.runs.selection import check_attention_budget, parse_indices, select
from tests.tiny import ENGINE_MODELS, hand_result

TEXT = "The quick brown fox jumps over the lazy dog, then sleeps."
TOL = 1e-5
MODELS = list(ENGINE_MODELS)
_LOADED: dict[str, mhsa.engine.LoadedModel] = {}


@pytest.fixture(params=MODELS)
def model(request) -> mhsa.engine.LoadedModel:
    value = request.getfixturevalue(request.param)
    if isinstance(value, mhsa.engine.LoadedModel):
        return value
    if value not in _LOADED:
        _LOADED[value] = mhsa.load_model(value, device="cpu")
    return _LOADED[value]


@pytest.fixture
def llama(tiny_llama_path: str) -> mhsa.engine.LoadedModel:
    if tiny_llama_path not in _LOADED:
        _LOADED[tiny_llama_path] = mhsa.load_model(tiny_llama_path, device="cpu")
    return _LOADED[tiny_llama_path]


@pytest.mark.parametrize("engine", ["transformers", "mhsa"])
def test_selected_weights_equal_the_models_eager_weights(model, engine):
    full = mhsa.attend(TEXT, model=model)  # the model's own eager attention, every layer
    layers, heads = full.num_layers, full.num_heads
    last, picked = layers - 1, [heads - 1, 1]  # unordered on purpose: kept ascending
    part = mhsa.attend(TEXT, model=model, engine=engine, layers=[last], heads=picked)
    assert part.layer_ids == [last] and part.head_ids == [1, heads - 1]
    assert part.attention.shape == (1, 2, full.num_tokens, full.num_tokens)
    np.testing.assert_allclose(part.attention[0], full.attention[last, [1, heads - 1]], atol=TOL)
    assert part.head_labels() == [f"L{last}H1", f"L{last}H{heads - 1}"]
    assert part.causal == full.causal
    first = mhsa.attend(TEXT, model=model, engine=engine, layers="0", heads=None)
    np.testing.assert_allclose(first.attention, full.attention[:1], atol=TOL)
    assert first.head_ids is None and first.layer_ids == [0]


def test_blocks_not_selected_run_fused_and_the_pass_stops_after_the_last_selected(llama):
    """Engine mhsa: our module's sdpa backend below the selected layer, the eager steps in it,
    nothing above it; engine transformers: the model's own blocks run with sdpa meanwhile."""
    calls: list[str] = []
    backends = dict(mhsa.engine.attention.core.ATTENTION_BACKENDS)

    def counting(name):
        def run(*args, **kwargs):
            calls.append(name)
            return backends[name](*args, **kwargs)

        return run

    mhsa.engine.attention.core.ATTENTION_BACKENDS.update(
        {name: counting(name) for name in backends}
    )
    try:
        mhsa.attend(TEXT, model=llama, engine="mhsa", layers=1)
        assert calls == ["sdpa", "eager-inplace"]  # layer 0 fused, layer 1 with its weights
        calls.clear()
        mhsa.attend(TEXT, model=llama, engine="mhsa", layers=0)
        assert calls == ["eager-inplace"]  # layer 1 never ran
    finally:
        mhsa.engine.attention.core.ATTENTION_BACKENDS.update(backends)
    seen: list[str] = []
    block = llama.model.layers[0].self_attn
    handle = block.register_forward_pre_hook(
        lambda m, _args: seen.append(m.config._attn_implementation)
    )
    try:
        mhsa.attend(TEXT, model=llama, layers=1)
    finally:
        handle.remove()
    assert seen == ["sdpa"]
    assert llama.model.config._attn_implementation == "eager"  # put back


def test_16_bit_storage_and_its_error(llama):
    full = mhsa.attend(TEXT, model=llama)
    half = mhsa.attend(TEXT, model=llama, attention_dtype="float16")
    assert half.attention.dtype == np.float16 and half.attention_dtype == "float16"
    assert half.layer_ids is None and half.head_ids is None
    # weights in [0, 1]: rounding to float16 moves one by at most half its spacing, 2**-12
    assert np.abs(half.attention.astype(np.float32) - full.attention).max() <= 2**-12
    brain = mhsa.attend(TEXT, model=llama, layers=[0, 1], attention_dtype="bfloat16")
    values = torch.from_numpy(brain.attention.astype(np.float32))
    normal = values >= 2**-14  # where float16 holds every bfloat16 value exactly
    assert torch.equal(values[normal], values[normal].bfloat16().float())
    assert np.abs(brain.attention.astype(np.float32) - full.attention).max() <= 2**-9


def test_statistics_of_16_bit_attention_stay_close_to_float32(llama):
    """The error README documents: statistics of float16-stored weights, summed in float64."""
    full = mhsa.head_stats(mhsa.attend(TEXT, model=llama))
    half = mhsa.head_stats(mhsa.attend(TEXT, model=llama, attention_dtype="float16"))
    columns = ["entropy", "mean_distance", "to_first", "to_sep", "to_self", "to_prev"]
    diff = (half[columns] - full[columns]).abs().max()
    assert diff["entropy"] < 2e-3
    assert diff.drop("entropy").max() < 1e-3


def test_partial_results_feed_statistics_similarity_sinks_and_files(llama, tmp_path):
    full = mhsa.attend(TEXT, model=llama)
    part = mhsa.attend(TEXT, model=llama, layers=1, heads="1-2")
    stats = mhsa.head_stats(part)
    assert list(stats.index) == ["L1H1", "L1H2"]
    assert list(stats["layer"]) == [1, 1] and list(stats["head"]) == [1, 2]
    whole = mhsa.head_stats(full)
    np.testing.assert_allclose(
        stats["entropy"].to_numpy(), whole.loc[["L1H1", "L1H2"], "entropy"].to_numpy(), atol=1e-5
    )
    sim = mhsa.head_similarity(part)
    whole_sim = mhsa.head_similarity(full)
    np.testing.assert_allclose(
        sim.to_numpy(), whole_sim.loc[["L1H1", "L1H2"], ["L1H1", "L1H2"]].to_numpy(), atol=1e-4
    )
    sinks = mhsa.analysis.attention_sinks(part).table
    assert set(sinks["head"]) == {"L1H1", "L1H2"} and set(sinks["layer"]) == {1}
    path = part.save(tmp_path / "part.npz")
    back = mhsa.AttentionResult.load(path)
    assert (
        back.layer_ids == [1]
        and back.head_ids == [1, 2]
        and back.head_labels()
        == [
            "L1H1",
            "L1H2",
        ]
    )
    assert back.index_of(1, 2) == (0, 1)
    with pytest.raises(mhsa.InputError, match="L0H0 was not materialised"):
        back.index_of(0, 0)
    assert "layers 1 x heads 1-2 of 2 x 4, float32" in part.materialised


def test_rollout_needs_consecutive_layers_from_zero(llama):
    full = mhsa.attend(TEXT, model=llama)
    first = mhsa.attend(TEXT, model=llama, layers=0)
    np.testing.assert_allclose(
        mhsa.analysis.attention_rollout(first)[0],
        mhsa.analysis.attention_rollout(full)[0],
        atol=1e-5,
    )
    for selected in ({"layers": 1}, {"heads": "0-1"}):
        part = mhsa.attend(TEXT, model=llama, **selected)
        with pytest.raises(mhsa.InputError, match="consecutive layers from 0 with every head"):
            mhsa.analysis.attention_rollout(part)


def test_value_norms_and_verify_on_selected_layers(llama):
    full = mhsa.attend(TEXT, model=llama, norms=True)
    part = mhsa.attend(TEXT, model=llama, layers=1, heads=[0, 3], norms=True)
    np.testing.assert_allclose(part.norms[0], full.norms[1, [0, 3]], rtol=1e-4, atol=1e-6)
    checked = mhsa.attend(TEXT, model=llama, engine="mhsa", layers=[0, 1], heads=2, verify=True)
    assert len(checked.layer_max_abs_diff) == 2 and checked.max_abs_diff < TOL


def test_bad_selections_name_the_models_sizes(llama):
    with pytest.raises(mhsa.InputError, match=r"Layers 2 out of range: the model has 2 layers"):
        mhsa.attend(TEXT, model=llama, layers=[0, 2])
    with pytest.raises(mhsa.InputError, match=r"Heads 4, 7 out of range.*2 layers of 4 heads"):
        mhsa.attend(TEXT, model=llama, heads="4,7")
    with pytest.raises(mhsa.InputError, match="No layers selected: choose some of the 2 layers"):
        mhsa.attend(TEXT, model=llama, layers=[])
    with pytest.raises(mhsa.InputError, match="Unknown attention_dtype 'int8'"):
        mhsa.attend(TEXT, model=llama, attention_dtype="int8")
    with pytest.raises(mhsa.InputError, match="runs backwards"):
        mhsa.attend(TEXT, model=llama, heads="3-1")
    with pytest.raises(mhsa.InputError, match="not a list of numbers"):
        mhsa.attend(TEXT, model=llama, layers="1; drop table")


def test_a_budget_exceeded_is_refused_before_the_model_runs(llama):
    def never(*_args):
        raise AssertionError("the model ran")

    handle = llama.model.register_forward_pre_hook(never)
    try:
        with pytest.raises(mhsa.InputError) as info:
            mhsa.attend(TEXT, model=llama, layers="0-1", max_attention_mb=1e-4)
    finally:
        handle.remove()
    message = str(info.value)
    tokens = len(mhsa.attend(TEXT, model=llama, layers=0).tokens)
    megabytes = 2 * 4 * tokens * tokens * 4 / 2**20
    assert f"2 layers x 4 heads over {tokens:,} x {tokens:,} tokens in float32" in message
    assert f"hold {megabytes:.2g} MB" in message and "MHSA_MAX_ATTENTION_MB" in message
    assert "fewer heads" in message and "float16" in message


def test_selection_parsing_and_budget_arithmetic():
    assert parse_indices("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_indices(5) == [5] and parse_indices(None) is None
    with pytest.raises(mhsa.InputError):
        parse_indices([1, True])
    s = select(22, 32, 21, "0-7", "float16")
    assert s.layers == (21,) and s.heads == tuple(range(8)) and s.layer_ids == [21]
    check_attention_budget(s, 4096, 4096, 256.0)  # 8 heads x 4096^2 x 2 bytes = 256 MiB
    with pytest.raises(mhsa.InputError, match="hold 512 MB"):
        check_attention_budget(select(22, 32, 21, "0-15", "float16"), 4096, 4096, 256.0)


def test_encoder_decoders_are_refused_with_a_message(tiny_bart_path):
    lm = mhsa.load_model(tiny_bart_path, device="cpu")
    with pytest.raises(mhsa.UnsupportedModelError, match="encoder-decoder"):
        mhsa.attend(TEXT, model=lm, text_pair="Der Fuchs.", layers=0)


def test_attend_layers_streams_each_selected_layer(llama):
    full = mhsa.attend(TEXT, model=llama)
    got: list[mhsa.AttentionResult] = []
    header = mhsa.engine.attend_layers(TEXT, got.append, model=llama, heads="2-3")
    assert [r.layer_ids for r in got] == [[0], [1]]
    for layer, r in enumerate(got):
        np.testing.assert_allclose(r.attention[0], full.attention[layer, 2:4], atol=TOL)
        assert r.head_labels() == [f"L{layer}H2", f"L{layer}H3"] and r.causal
    assert header.attention.shape[0] == 0 and header.tokens == full.tokens


def test_streamed_statistics_equal_the_whole_results(llama):
    texts = [TEXT, "A second, shorter sentence."]
    streamed = mhsa.analysis.streamed_head_stats(texts, model=llama, heads="1-3")
    whole = mhsa.head_stats([mhsa.attend(t, model=llama) for t in texts])
    labels = [f"L{layer}H{h}" for layer in (0, 1) for h in (1, 2, 3)]
    assert list(streamed.index) == labels
    columns = ["entropy", "mean_distance", "to_first", "to_prev", "confidence"]
    np.testing.assert_allclose(
        streamed[columns].to_numpy(), whole.loc[labels, columns].to_numpy(), atol=1e-5
    )
    sims = mhsa.analysis.streamed_head_similarity(texts, model=llama, layers=1)
    whole_sim = mhsa.head_similarity([mhsa.attend(t, model=llama) for t in texts])
    layer1 = [f"L1H{h}" for h in range(4)]
    assert list(sims) == [1]
    np.testing.assert_allclose(
        sims[1].to_numpy(), whole_sim.loc[layer1, layer1].to_numpy(), atol=1e-4
    )


def test_the_eager_fallback_reads_the_models_own_blocks(llama):
    """A model our module cannot load runs its own eager blocks, the selected ones read by a
    hook (here forced through ``eager=True``, the path ``verify`` compares with)."""
    from mhsa.engine.runs.partial import selected_forward

    full = mhsa.attend(TEXT, model=llama)
    inputs = dict(mhsa.engine.encoding.encode(llama, TEXT, None, None).inputs)
    selection = select(2, 4, 1, "0,3")
    with torch.inference_mode():
        got = selected_forward(llama, inputs, selection, our_module=False, eager=True)
    np.testing.assert_allclose(got.attention[0], full.attention[1, [0, 3]], atol=TOL)
    assert got.causal and not got.fused


def test_a_file_written_layer_by_layer_loads_as_the_result(llama, tmp_path):
    from mhsa.engine.runs.layer_files import save_layers

    full = mhsa.attend(TEXT, model=llama)
    header = save_layers(
        tmp_path / "x.npz", TEXT, model=llama, heads="1-2", attention_dtype="float16"
    )
    assert header.attention.shape[0] == 0
    back = mhsa.AttentionResult.load(tmp_path / "x.npz")
    assert back.attention.dtype == np.float16 and back.attention.shape[:2] == (2, 2)
    assert back.layer_ids is None and back.head_ids == [1, 2]
    assert np.abs(back.attention.astype(np.float32) - full.attention[:, 1:3]).max() <= 2**-12
    assert back.tokens == full.tokens and back.causal
    one = save_layers(tmp_path / "y.npz", TEXT, model=llama, layers=1)
    assert one.head_ids is None
    again = mhsa.AttentionResult.load(tmp_path / "y.npz")
    assert again.layer_ids == [1] and again.head_labels()[0] == "L1H0"
    np.testing.assert_allclose(again.attention, full.attention[1:], atol=TOL)
    with pytest.raises(mhsa.InputError, match="out of range"):
        save_layers(tmp_path / "z.npz", TEXT, model=llama, layers=9)
    assert not (tmp_path / "z.npz").exists()


def test_figures_of_a_partial_result_name_the_models_layers_and_heads(llama):
    from mhsa import plots

    part = mhsa.attend(TEXT, model=llama, layers=1, heads="2-3")
    grid = plots.head_grid(part)
    assert list(grid.layout.yaxis.ticktext) == ["L1"]
    assert list(grid.layout.xaxis.ticktext) == ["H2", "H3"]
    markers = np.asarray(grid.data[1].customdata)
    assert markers.tolist() == [[0, 0, 1, 2], [0, 1, 1, 3]]  # positions, then the model's
    heat = plots.head_heatmap(part, 0, 1)
    assert heat.layout.title.text.startswith("Layer 1, head 3")


def test_a_long_heads_heatmap_is_block_averaged_with_token_spans():
    from mhsa import plots
    from mhsa.plots.heads import FULL_SIDE

    n = FULL_SIDE * 2 + 1
    rng = np.random.default_rng(0)
    a = rng.random((1, 1, n, n)).astype(np.float32)
    a /= a.sum(-1, keepdims=True)
    tokens = [f"t{i}" for i in range(n)]
    result = hand_result(a, tokens, layer_ids=[7], head_ids=[5])
    fig = plots.head_heatmap(result, 0, 0)
    z = np.asarray(fig.data[0].z)
    assert z.shape == (FULL_SIDE, FULL_SIDE)
    # block (0, 0) averages query rows 0..2 and sums key columns 0..2 (edges of linspace)
    edges = np.linspace(0, n, FULL_SIDE + 1).round().astype(int)
    assert z[0, 0] == pytest.approx(a[0, 0, : edges[1], : edges[1]].sum(1).mean(), rel=1e-5)
    assert fig.layout.title.text.startswith("Layer 7, head 5")
    assert f"shown at {FULL_SIDE}x{FULL_SIDE}" in fig.layout.title.text


def test_head_detection_reads_a_partial_result(llama):
    from mhsa.analysis.detection import head_table

    full = mhsa.attend(TEXT, model=llama)
    part = mhsa.attend(TEXT, model=llama, layers=1, heads="1,3")
    got = mhsa.detect_heads(TEXT, "previous token", model=llama, result=part)
    whole = mhsa.detect_heads(TEXT, "previous token", model=llama, result=full)
    assert list(got.index) == ["L1H1", "L1H3"]
    np.testing.assert_allclose(
        got["score"].to_numpy(), whole.loc[["L1H1", "L1H3"], "score"].to_numpy(), atol=1e-5
    )
    table = head_table(part, {"x": np.zeros((1, 2))})
    assert list(table["layer"]) == [1, 1] and list(table["head"]) == [1, 3]


def test_the_command_line_writes_selected_layers_layer_by_layer(tiny_llama_path, tmp_path, capsys):
    from mhsa.__main__ import main

    out = tmp_path / "long.npz"
    argv = ["attend", TEXT, "--model", tiny_llama_path, "--device", "cpu", "--layers", "1"]
    assert main([*argv, "--heads", "0-1", "--dtype", "float16", "--out", str(out)]) == 0
    assert "written layer by layer" in capsys.readouterr().out
    back = mhsa.AttentionResult.load(out)
    full = mhsa.attend(TEXT, model=_LOADED.get(tiny_llama_path) or tiny_llama_path, device="cpu")
    assert back.layer_ids == [1] and back.head_ids == [0, 1] and back.attention_dtype == "float16"
    assert np.abs(back.attention.astype(np.float32) - full.attention[1:, :2]).max() <= 2**-12
    with pytest.raises(SystemExit) as exc:  # out of range: one line naming the model's sizes
        main([*argv, "--heads", "5"])
    assert exc.value.code == 2
    assert "Heads 5 out of range: the model has 2 layers of 4 heads" in capsys.readouterr().err
