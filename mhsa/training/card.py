"""A trained model saved as a transformers folder (config, safetensors weights, tokenizer)
with its model card (the Hugging Face convention: what it was trained on, the command, the seed,
the metrics, the limits), atomically."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from mhsa.training.families import model_family
from mhsa.training.results import phase_change
from mhsa.training.tasks import SYMBOLS, task_examples, task_spec

if TYPE_CHECKING:
    from mhsa.training.trainer import TrainResult

__all__ = ["card_examples", "model_card", "save_model"]

#: the repository's root: the command in a card names ``data/toy/<task>`` relative to it
_REPO = Path(__file__).resolve().parents[2]


def _command(result: TrainResult, out: Path) -> str:
    config = result.config
    changed = config.changed()
    options = [
        f"--{k}" if v is True else f"--{k} {v:g}" if isinstance(v, float) else f"--{k} {v}"
        for k, v in changed.items()
        if k not in ("task", "seed")
    ]
    where = out.resolve()
    if where.is_relative_to(_REPO):  # as run from the repository's root
        where = where.relative_to(_REPO)
    return " ".join(
        ["python -m mhsa train", config.task, f"--out {where}", f"--seed {config.seed}", *options]
    )


def model_card(result: TrainResult, out: Path) -> str:
    """The model card (README.md) of a trained model: what it learned, how, how well, limits."""
    return "\n".join([*_card_training(result, out), *_card_results(result), *_card_limits(result)])


def _card_training(result: TrainResult, out: Path) -> list[str]:
    """The card's header, and how the model was trained."""
    import torch
    import transformers

    config, spec = result.config, task_spec(result.config.task)
    n = sum(p.numel() for p in result.model.parameters())
    family = model_family(config.family).model_class
    layers = (
        f"{config.layers} encoder and {config.layers} decoder layers"
        if spec.encoder_decoder
        else f"{config.layers} layers"
    )
    mlp = (
        "trained"
        if config.mlp
        else "with outputs fixed at zero (their output projections are zero and frozen: an "
        "attention-only model, as in Olsson et al. 2022; the saved model is a normal "
        f"{family})"
    )
    return [
        "---",
        "library_name: transformers",
        f"tags: [toy, {config.task}, attention, mhsa-explorer]",
        "---",
        f"# toy:{config.task}",
        "",
        (
            f"A {family} with {layers}"
            if spec.encoder_decoder
            else f"A {config.layers}-layer {family}"
        )
        + f" ({config.heads} heads per layer, width {config.width}, {n:,} parameters) trained "
        f"from scratch on the `{config.task}` task of MHSA Explorer: " + spec.description + ".",
        "",
        "## Training",
        "",
        f"Trained by this command with {_threads()} (on the CPU, the same torch version and "
        "thread count give bitwise the same weights):",
        "",
        "```",
        _command(result, out),
        "```",
        "",
        f"- seed: {config.seed}",
        f"- recipe: {config.family}, {layers}, {config.heads} heads, width "
        f"{config.width}; feed-forward blocks {mlp}",
        f"- optimizer: AdamW (betas 0.9, 0.98, weight decay 0.01), peak learning rate "
        f"{config.lr:g}, {config.warmup} warm-up steps then cosine decay to a tenth, gradient "
        f"norm clipped at 1; {config.steps} steps of {config.batch} sequences"
        + (f" (stopped early at step {result.steps_done})" if result.stopped_early else ""),
        "- loss: cross-entropy on the scored positions only",
        "- attention ran as MHSA Explorer's MultiHeadSelfAttention (the project's from-scratch "
        "module) throughout training (the mhsa engine's swap, with gradients); its weights "
        "were then written back into the model's eager attention blocks",
        f"- training time: {result.seconds:.1f} s wall clock, {result.cpu_seconds:.1f} s CPU "
        f"time of the training thread, on {_device(result)} with {_threads()}, torch "
        f"{torch.__version__}, transformers {transformers.__version__}",
    ]


def _card_results(result: TrainResult) -> list[str]:
    """How well it learned: held-out accuracy, the best head scores, the phase change."""
    spec = task_spec(result.config.task)
    lines = [
        "",
        "## Results",
        "",
        f"- next-token accuracy on {spec.scored}: **{result.accuracy:.3f}** "
        f"({result.final.sequences if result.final else '?'} held-out sequences)",
    ]
    anti = result.final.best_anti_diagonal() if result.final is not None else None
    if anti is not None:
        lines += [
            f"- best cross-attention anti-diagonal score: {anti[1]:.2f} ({anti[0]}: decoder "
            "layer and head; the mean attention from each scored decoder position k to encoder "
            "position L - k, the symbol it writes: encoder [BOS] s_1 .. s_L, decoder [BOS] "
            "t_1 .. t_L with t_i = s_(L+1-i), position k predicting t_(k+1); the same held-out "
            "sequences)",
        ]
    elif result.final is not None:
        prev, ind = result.final.best()
        lines += [
            f"- best previous-token score in layer 0: {prev:.2f} (mean attention from each "
            "repeated position to the position before it)",
            f"- best induction score above layer 0: {ind:.2f} (mean attention from each "
            "repeated position to the token after the earlier occurrence of its token)",
        ]
    change = phase_change(result.snapshots)
    if change is not None:
        lines.append(
            f"- phase change (Olsson et al. 2022): the held-out accuracy rose fastest from "
            f"step {change.step} to {change.end} ({change.before:.2f} to {change.after:.2f}), "
            f"as an induction head formed (its score on the probe: {change.score:.2f})"
        )
    return lines


def _card_limits(result: TrainResult) -> list[str]:
    """What the model knows and what it does not."""
    spec = task_spec(result.config.task)
    return [
        "",
        "## Vocabulary and limits",
        "",
        f"{len(SYMBOLS)} made-up syllables ({', '.join(SYMBOLS[:5])}, ...) plus [PAD], [UNK], "
        "[BOS], [SEP]; the tokenizer splits on spaces and puts [BOS] in front. The model knows "
        "nothing but this task: it says nothing about language. Inputs are sequences of "
        f"{spec.lengths[0]} to {spec.lengths[1]} distinct symbols; longer or repeated inputs are "
        "outside what it was trained on.",
        *_card_use(result),
        *card_examples(result.config.task),
        "",
    ]


def card_examples(task: str) -> list[str]:
    """The card's example texts (``mhsa.training.tasks.task_examples``): what the app opens the
    model on, each on a line of its own as typed in the sentence box (an encoder-decoder: the
    source, then its target for the decoder)."""
    lines = [
        "",
        "## Example texts",
        "",
        "Type one in the sentence box (the app opens on the first):",
        "",
    ]
    for example in task_examples(task):
        lines.append(f"- `{example.text}`")
        if example.target is not None:
            lines.append(f"  (target: `{example.target}`)")
    return lines


def _card_use(result: TrainResult) -> list[str]:
    """How to open an encoder-decoder model (its attention, its predictions)."""
    if not task_spec(result.config.task).encoder_decoder:
        return []
    family = model_family(result.config.family).model_class
    return [
        "",
        'Its attention: `mhsa.attend("ba ke mo", text_pair="mo ke ba", '
        f'model="toy:{result.config.task}", engine="transformers")` (the source to the '
        "encoder, the reversed symbols to the decoder, [BOS] put in front of both; "
        "`cross_attention` is `[layers, heads, decoder tokens, encoder tokens]`). "
        "Its predictions: `mhsa.load_model(...).head_model` (a "
        f"`{family}`), decoding from [BOS].",
    ]


def _threads() -> str:
    import torch

    n = torch.get_num_threads()
    return f"{n} CPU thread" + ("s" if n != 1 else "")


def _device(result: TrainResult) -> str:
    device = next(result.model.parameters()).device
    return f"{device.type} ({platform.processor() or platform.machine()})"


def save_model(result: TrainResult, out: str | Path, *, card: bool = True) -> Path:
    """Save a trained model as a transformers folder: config, safetensors weights, tokenizer
    and (``card``) a model card README.md. Atomic: written into a temporary folder beside
    ``out``, then renamed; an existing ``out`` is replaced only once the new folder is whole, and
    a failure leaves no half-written folder.

    Returns:
        ``out`` (resolved).
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in logs and the CLI
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    old = None
    try:
        result.model.save_pretrained(tmp, safe_serialization=True)
        result.tokenizer.save_pretrained(tmp)
        if card:
            (tmp / "README.md").write_text(model_card(result, out), encoding="utf-8")
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / out.name)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.replace(old / out.name, out)  # the previous model stays where it was
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out
