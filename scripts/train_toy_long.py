"""Train the shipped ``toy:induction-long`` (``data/toy/induction-long``): a 2-layer
attention-only Llama like ``toy:induction`` that reads 2,048 positions, trained on the
``induction-long`` task (``mhsa.training.tasks.LONG_TASKS``: random two-syllable words drawn with
replacement, first half random, second half its copy, 8 to 1,023 words a half).

The project's own training pieces, in nanoGPT's shape: ``build_model`` (seeded weights,
feed-forward outputs zero and frozen), ``trained_through_ours`` (attention runs as our
``MultiHeadSelfAttention`` for the whole run, weights written back at the end),
``make_optimizer`` and ``lr_at`` (AdamW, warm-up then cosine decay), ``scored_loss``. Two
things differ from ``mhsa.training.train``, because sequences run to 2,047 tokens on a CPU:
every batch has one input length (drawn log-uniformly; no padding) and about ``--tokens`` tokens,
and logits are computed only for the last ``L + 1`` positions (``logits_to_keep``), which hold
every scored one.

    PYTHONPATH=. python scripts/train_toy_long.py --out data/toy/induction-long --seed 0

Reproducible on the CPU with the same torch version and thread count (``--threads``).
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from mhsa.analysis.roles import induction_scores
from mhsa.training.build import as_loaded_model, build_model, trained_through_ours
from mhsa.training.card import card_examples
from mhsa.training.config import TrainConfig
from mhsa.training.loop import lr_at, make_optimizer
from mhsa.training.probing import model_inputs, scored_loss
from mhsa.training.tasks import make_tokenizer, sample, task_spec

TASK = "induction-long"
#: positions the model accepts: the longest sequence (2,047 tokens) fits
POSITIONS = 2048
#: the input lengths (words a half) whose random-token induction score the card reports
REPORTED = (250, 500, 1000)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("data/toy/induction-long"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=1200, help="the schedule's length")
    p.add_argument("--stop-at", type=int, default=859, help="stop after this many steps")
    p.add_argument("--tokens", type=int, default=2048, help="tokens a batch (about)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--init", type=Path, default=Path("data/toy/induction"))
    p.add_argument("--rope-theta", type=float, default=1e6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--minutes", type=float, default=15.0, help="stop after this much training")
    return p


def _step_batch(spec, rng: np.random.Generator, tokens: int):
    """One batch: an input length L drawn log-uniformly over the task's lengths (as many
    batches from 8 to 90 words as from 90 to 1,023: short batches are cheap and teach the
    heads quickly, long ones teach them to find a match 1,000 positions back), as many
    sequences of 2 L + 1 tokens as fill about ``tokens``."""
    lo, hi = spec.lengths
    n = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    return sample(spec, rng, max(1, tokens // (2 * n + 1)), length=n), n


def train(args: argparse.Namespace) -> tuple[object, dict]:
    torch.set_num_threads(args.threads)
    spec = task_spec(TASK)
    config = TrainConfig(
        task=TASK,
        heads=args.heads,
        width=args.width,
        steps=args.steps,
        lr=args.lr,
        warmup=args.warmup,
        seed=args.seed,
    )
    model = build_model(config, vocab_size=len(spec.vocab), positions=POSITIONS)
    # rotary angles that turn slowly enough for a head to match content 2,000 positions apart
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model.config.rope_parameters = {"rope_theta": args.rope_theta, "rope_type": "default"}
    model.model.rotary_emb = LlamaRotaryEmbedding(config=model.config)
    if args.init is not None:  # toy:induction's weights: its heads, taught to reach further
        from safetensors.torch import load_file

        model.load_state_dict(load_file(args.init / "model.safetensors"))
    rng = np.random.default_rng([args.seed, 0])
    start, cpu_start = time.perf_counter(), time.thread_time()
    done = 0
    with trained_through_ours(model, config) as (blocks, _run):
        optimizer = make_optimizer(model, blocks, config.lr)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for step in range(config.steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(config, step)
            batch, n = _step_batch(spec, rng, args.tokens)
            inputs, targets = model_inputs(batch, torch.device("cpu"))
            logits = model(**inputs, logits_to_keep=n + 1).logits  # (B, n + 1, V)
            loss = scored_loss(logits, targets[:, -(n + 1) :])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            done = step + 1
            if step % 20 == 0:
                print(
                    f"step {step} L {n} loss {loss.item():.3f} {time.perf_counter() - start:.0f}s"
                )
            if done >= args.stop_at or time.perf_counter() - start > args.minutes * 60:
                break
    model.eval().requires_grad_(False)
    facts = {
        "config": config,
        "steps_done": done,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.thread_time() - cpu_start,
    }
    return model, facts


def measure(model, tokenizer) -> dict[int, tuple[str, float]]:
    """The best head's random-token induction score (``mhsa.analysis.roles.induction_scores``:
    ten sequences of ``length`` random words, each repeated) at each reported length."""
    lm = as_loaded_model(model, tokenizer, f"toy:{TASK}")
    out = {}
    for length in REPORTED:
        scores = induction_scores(lm, length=length, count=2 if length > 500 else 4)
        layer, head = np.unravel_index(int(scores.argmax()), scores.shape)
        out[length] = (f"L{layer}H{head}", float(scores.max()))
    return out


def card(facts: dict, scores: dict[int, tuple[str, float]], n_params: int, args) -> str:
    config = facts["config"]
    spec = task_spec(TASK)
    threads = f"{args.threads} CPU thread" + ("s" if args.threads != 1 else "")
    measured = "; ".join(
        f"{2 * n:,} tokens: {s:.2f} ({head})" for n, (head, s) in sorted(scores.items())
    )
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            f"tags: [toy, {TASK}, attention, mhsa-explorer]",
            "---",
            f"# toy:{TASK}",
            "",
            f"A {config.layers}-layer LlamaForCausalLM ({config.heads} heads per layer, width "
            f"{config.width}, {n_params:,} parameters, {POSITIONS:,} positions, rotary base "
            f"{args.rope_theta:g}) that started from `toy:induction`'s weights and was trained "
            f"on the `{TASK}` task of MHSA Explorer: {spec.description}. It shows the "
            "long-input views (a layer and a range of heads under Long inputs, the zoom window) "
            "offline.",
            "",
            "## Training",
            "",
            f"Trained by this command with {threads} (on the CPU, the same torch version and "
            "thread count give bitwise the same weights; its defaults are this run's settings, "
            "and `--minutes` (15) stops a slower machine earlier):",
            "",
            "```",
            f"PYTHONPATH=. python scripts/train_toy_long.py --out data/toy/{TASK} --seed "
            f"{config.seed}",
            "```",
            "",
            f"- seed: {config.seed}",
            f"- recipe: llama, {config.layers} layers, {config.heads} heads, width "
            f"{config.width}; feed-forward blocks with outputs fixed at zero (an attention-only "
            "model, as in Olsson et al. 2022; the saved model is a normal LlamaForCausalLM)",
            f"- optimizer: AdamW (betas 0.9, 0.98, weight decay 0.01), peak learning rate "
            f"{config.lr:g}, {config.warmup} warm-up steps then cosine decay to a tenth over "
            f"{config.steps} steps, gradient norm clipped at 1; {facts['steps_done']} steps "
            f"done (`--stop-at`), each of one input length L drawn log-uniformly from "
            f"{spec.lengths[0]} to {spec.lengths[1]} and about {args.tokens:,} tokens",
            f"- start: `toy:induction`'s weights (`--init {args.init}`), its rotary base "
            f"raised from 10000 to {args.rope_theta:g} (angles that turn slowly enough for a "
            "head to match tokens 2,000 positions apart: with 10000 and these weights, "
            "the induction score fell to 0.03 at 1,000 tokens)",
            "- loss: cross-entropy on the repeated half only (its first symbol cannot be foreseen)",
            "- attention ran as MHSA Explorer's MultiHeadSelfAttention (the project's "
            "from-scratch module) throughout training; its weights were then written back into "
            "the model's eager attention blocks",
            f"- training time: {facts['seconds']:.0f} s wall clock, {facts['cpu_seconds']:.0f} "
            f"s CPU time of the training thread, on cpu ({platform.machine()}) with {threads}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}",
            "",
            "## Results",
            "",
            "- best induction score (TransformerLens's random-token test, "
            f"`mhsa.analysis.induction_scores`: random symbols, each sequence repeated; a head's "
            f"mean attention from each repeated token to the token after its earlier copy): "
            f"{measured}",
            "",
            "## Vocabulary and limits",
            "",
            f"{len(spec.symbols):,} made-up syllables (ba, be, bi, ...) plus [PAD], "
            "[UNK], [BOS], [SEP]; the tokenizer splits on spaces and puts [BOS] in front. The "
            "model knows nothing but this task: it says nothing about language. Inputs are "
            "up to 2,047 tokens; it was trained on repeats only.",
            *card_examples(TASK),
            "",
        ]
    )


def main() -> None:
    args = _parser().parse_args()
    model, facts = train(args)
    tokenizer = make_tokenizer(task_spec(TASK))
    scores = measure(model, tokenizer)
    print(scores)
    n = sum(p.numel() for p in model.parameters())
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(card(facts, scores, n, args), encoding="utf-8")
    print(f"saved {out} after {facts['steps_done']} steps, {facts['seconds']:.0f} s")


if __name__ == "__main__":
    main()
