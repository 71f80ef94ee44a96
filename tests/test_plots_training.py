"""The training figures draw the snapshots' own numbers: loss and accuracy per step, each head's
attention on the probe, each head's scores over the steps, and the phase change where it is."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from mhsa import plots


def snapshots(count: int = 4, layers: int = 2, heads: int = 3, n: int = 5) -> list:
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        attention = rng.random((layers, heads, n, n)).astype(np.float32)
        out.append(
            SimpleNamespace(
                step=10 * (i + 1),
                loss=3.0 - i * 0.5,
                accuracy=0.1 + 0.2 * i,
                elapsed=0.1 * i,
                probe_tokens=["[BOS]", "ba", "<b>x</b>", "ba", "#000001"][:n],
                probe_attention=attention / attention.sum(-1, keepdims=True),
                previous_token_scores=rng.random((layers, heads)).astype(np.float32),
                induction_scores=rng.random((layers, heads)).astype(np.float32),
            )
        )
    return out


def test_curves_draw_each_snapshots_loss_and_accuracy_and_mark_the_phase_change() -> None:
    snaps = snapshots()
    fig = plots.training_curves(plots.snapshot_history(snaps), steps=100, phase_change_step=30)
    loss, accuracy = fig.data
    assert list(loss.x) == [10, 20, 30, 40] and list(loss.y) == [s.loss for s in snaps]
    assert list(accuracy.y) == [s.accuracy for s in snaps]
    assert list(fig.layout.xaxis.range) == [0, 100]
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 2 and {s.x0 for s in lines} == {30}
    assert any("step 30" in a.text for a in fig.layout.annotations)


def test_no_phase_change_no_mark() -> None:
    fig = plots.head_scores_figure(plots.snapshot_scores(snapshots()))
    assert not fig.layout.shapes


def test_the_mosaic_is_every_heads_attention_and_escapes_the_tokens() -> None:
    snap = snapshots()[-1]
    fig = plots.probe_mosaic(snap.probe_tokens, snap.probe_attention, step=snap.step)
    assert len(fig.data) == 2 * 3
    for i, trace in enumerate(fig.data):
        np.testing.assert_array_equal(trace.z, snap.probe_attention[i // 3, i % 3])
        assert trace.name == f"L{i // 3}H{i % 3}"
    names = list(fig.data[0].x)
    assert names[2] == "&lt;b&gt;x&lt;/b&gt; #2" and "#000001" not in names[4]
    assert "at step 40" in fig.layout.title.text


def test_head_scores_are_one_line_per_head_and_score() -> None:
    snaps = snapshots()
    scores = plots.snapshot_scores(snaps)
    assert len(scores) == 4 * 2 * 3
    fig = plots.head_scores_figure(scores, steps=50, phase_change_step=20, threshold=0.5)
    assert len(fig.data) == 2 * 2 * 3
    dotted = [s for s in fig.layout.shapes if s.line.dash == "dot"]
    assert [(s.y0, s.y1, s.xref) for s in dotted] == [(0.5, 0.5, "x2 domain")]
    prev, ind = fig.data[2 * 4], fig.data[2 * 4 + 1]  # L1H1: the fifth head
    assert prev.name == ind.name == "L1H1" and prev.line.color == ind.line.color
    assert list(prev.y) == [s.previous_token_scores[1, 1] for s in snaps]
    assert list(ind.y) == [s.induction_scores[1, 1] for s in snaps]
    assert prev.showlegend and not ind.showlegend


def test_the_phase_change_marks_the_start_of_the_accuracys_steepest_rise() -> None:
    """A default induction run's snapshots (accuracy and best induction score, every 25 steps,
    as measured): the score on the probe passes 0.5 only at step 475, when the accuracy is
    already 0.93, the end of its jump. The phase change is where the accuracy rises fastest,
    found here by hand: 375 -> 400 (0.485 -> 0.633)."""
    from mhsa.training.results import TrainSnapshot, phase_change, phase_change_step

    accuracy = [0.015, 0.06, 0.14, 0.21, 0.348, 0.485, 0.633, 0.751, 0.869, 0.931, 0.967, 1.0]
    score = [0.06, 0.14, 0.2, 0.22, 0.19, 0.25, 0.26, 0.38, 0.49, 0.585, 0.65, 0.93]
    steps = [0, 100, 200, 300, 350, 375, 400, 425, 450, 475, 500, 1000]
    snaps = [
        TrainSnapshot(
            step=step,
            loss=1.0,
            accuracy=acc,
            elapsed=step / 100,
            probe_tokens=["[BOS]"],
            probe_attention=np.zeros((2, 1, 1, 1), dtype=np.float32),
            previous_token_scores=np.array([[0.9], [0.1]], dtype=np.float32),
            induction_scores=np.array([[0.0], [s]], dtype=np.float32),
        )
        for step, acc, s in zip(steps, accuracy, score, strict=True)
    ]
    slopes = [
        (b - a) / (t - s)
        for a, b, s, t in zip(accuracy, accuracy[1:], steps, steps[1:], strict=False)
    ]
    steepest = int(np.argmax(slopes))
    change = phase_change(snaps)
    assert change is not None
    assert (change.step, change.end) == (steps[steepest], steps[steepest + 1]) == (375, 400)
    assert (change.before, change.after) == (0.485, 0.633)
    assert phase_change_step(snaps) == 375 < 475  # not where the score first passes 0.5
    # before any head reached the score, no phase change is called
    assert phase_change(snaps[:9]) is None
