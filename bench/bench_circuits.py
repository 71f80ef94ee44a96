"""Edge attribution and faithfulness curves (``mhsa.circuits``) against plain forward passes of
the model itself, interleaved in one run.

    python -m bench.bench_circuits [--model toy:induction] [--device cpu|cuda] [--threads N]
                                   [--no-gpt2] [--gpt2-tokens 64 ...] [--llama-1b-tokens N ...]
                                   [--no-minilm] [--cpu-time]

Models: ``--model`` (the shipped toy:induction by default, 110 edges) with a repeat and the
repeat broken, then a random GPT-2 of GPT-2 small's shape (12 layers of 12 heads, width 768;
32,491 edges; random weights time as trained ones do) at 64 tokens, EAP only (``--no-gpt2``
skips it); then the embedded MiniLM (``default``, a post-norm encoder: 6 layers of 12 heads,
7,588 edges, each target reading its own copy of the chain of norms) with a word swapped
(``--no-minilm`` skips it): EAP on the target "similarity" and EAP-IG on "embedding", against
one forward and backward of the plain model (the cosine of its sentence embedding with the
second sentence's, differentiated with respect to its input embeddings); the faithfulness
curve against 10 plain forwards, and against the same curve with every target's copy in every
row (``circuit_postnorm.COPIES_ONLY_WHERE_MIXED`` off: the code before copies were kept only
where a target's edges are mixed), interleaved.

Targets (issue 40):

- EAP over every edge (``edge_attribution(method="eap")``: a clean and a corrupted forward as
  one batch of two, then one forward and backward with a zero on every receiver input) costs at
  most 3x one forward and backward of the plain model (the metric's gradient with respect to
  its input embeddings).
- A faithfulness curve of MIB's 10 sizes (``faithfulness_curve``: the two texts' runs, then the
  10 circuits as rows of one batch) costs at most the time of 10 plain forwards (one per size,
  as EAP-IG's ``evaluate_graph`` runs per circuit), so ratio <= 1.

Also printed: EAP-IG with its default 5 steps and "exact" (every edge alone, 32 per pass),
against the same baseline.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import mhsa
from bench.common import median_times, print_table
from mhsa.circuits import discovery as circuits
from mhsa.circuits import postnorm as circuit_postnorm
from tests.tiny import save_tiny

#: a repeat of 10 symbols up to its 5th, and the same with that symbol's first occurrence
#: replaced (the test's pair: the induction head's key no longer matches)
TOY = (
    "ba ke mo di fu lo ni pa su te ba ke mo di fu",
    "ba ke mo di ra lo ni pa su te ba ke mo di fu",
    "lo",
    "ba",
)


def _plain(
    lm: mhsa.engine.LoadedModel, text: str, answer: str, wrong: str, backward: bool
) -> float:
    """One forward (and backward) of the plain model: the metric at the last position."""
    tok = lm.tokenizer
    inputs = tok(text, return_tensors="pt").to(lm.device)
    a, w = (tok(" " + t, add_special_tokens=False)["input_ids"][0] for t in (answer, wrong))
    embed = lm.head_model.get_input_embeddings()
    with torch.set_grad_enabled(backward):
        embeddings = embed(inputs["input_ids"]).detach().requires_grad_(backward)
        logits = lm.head_model(inputs_embeds=embeddings).logits[0, -1]
        value = logits[a] - logits[w]
        if backward:
            value.backward()
    return float(value.detach())


def _gpt2_small_shape(folder: str, device: str, positions: int = 128) -> mhsa.engine.LoadedModel:
    """A random GPT-2 of GPT-2 small's shape, saved with the embedded model's tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    sizes = {"n_positions": max(128, positions), "n_embd": 768, "n_layer": 12, "n_head": 12}
    config = GPT2Config(vocab_size=30522, bos_token_id=101, eos_token_id=102, **sizes)
    return mhsa.load_model(save_tiny(folder, GPT2LMHeadModel(config)), device=device)


#: TinyLlama-1.1B's sizes, and the embedded WordPiece tokenizer's vocabulary and ids
TINYLLAMA_SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
}
_WORDPIECE = {"vocab_size": 30522, "bos_token_id": 101, "eos_token_id": 102}


def _llama_1b_shape(folder: str, device: str, positions: int = 2048) -> mhsa.engine.LoadedModel:
    """A random Llama of TinyLlama-1.1B's shape (22 layers of 32 query heads sharing 4
    key/value heads, width 2048, MLP 5632), float32, built on ``device``, saved with the
    embedded model's tokenizer (30,522 words instead of 32,000)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    positions = max(2048, positions)
    config = LlamaConfig(**TINYLLAMA_SHAPE, max_position_embeddings=positions, **_WORDPIECE)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    folder = save_tiny(folder, model)
    del model
    return mhsa.load_model(folder, device=device)


#: the shapes ``_big`` times: a builder and a description
SHAPES = {
    "gpt2": (_gpt2_small_shape, "random GPT-2 small shape (12 x 12, width 768)"),
    "llama-1b": (_llama_1b_shape, "random TinyLlama-1.1B shape (22 x 32, width 2048, GQA 4)"),
}


def _big(device: str, clock, tokens: int = 64, shape: str = "gpt2") -> None:
    """EAP over every edge of a real-size model (GPT-2 small's 32,491 edges by default) at
    ``tokens`` tokens against one forward+backward; on a GPU, the peak memory of each."""
    words = ("the cat sat on the mat and " * (tokens // 7 + 2)).split()[: tokens - 2]
    clean = " ".join(words)  # [CLS] + the words + [SEP]
    corrupted = " ".join(["dog" if w == "cat" else w for w in words[:-4]] + words[-4:])
    build, description = SHAPES[shape]
    cuda = torch.device(device).type == "cuda"
    with tempfile.TemporaryDirectory() as folder:
        lm = build(folder, device, tokens)
        kw = {"model": lm, "answer": "cat", "wrong": "dog"}
        fns = {
            "forward+backward": lambda: _plain(lm, clean, "cat", "dog", True),
            "eap": lambda: mhsa.circuits.edge_attribution(clean, corrupted, **kw),
            "eap, copies": _switched_off(
                circuits,
                "TAPPED_GRADIENTS",
                lambda: mhsa.circuits.edge_attribution(clean, corrupted, **kw),
            ),
        }
        peaks = {}
        for name, fn in fns.items():  # once each, alone: each one's peak memory on a GPU
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            fn()
            if cuda:
                peaks[name] = torch.cuda.max_memory_allocated() / 2**20
        edges = len(mhsa.circuits.edge_attribution(clean, corrupted, **kw))
        tokens = len(lm.tokenizer(clean)["input_ids"])
        times = median_times(fns, repeat=7, warmup=1, budget_s=90, clock=clock)
    one = times["forward+backward"]
    print(f"\n{description}, {tokens} tokens: {edges} edges; forward+backward {1000 * one:.1f} ms")
    if peaks:
        print("GPU peak MiB: " + ", ".join(f"{name} {mib:.0f}" for name, mib in peaks.items()))
    rows = [
        {"what": name, "ms": 1000 * times[name], "baseline": base, "ratio": times[name] / ref}
        for name, base, ref in (
            ("eap", "forward+backward", one),
            ("eap, copies", "forward+backward", one),
            ("eap", "eap, copies", times["eap, copies"]),
        )
    ]
    print_table(rows, ["what", "ms", "baseline", "ratio"])


#: MiniLM's pair (a word swapped) and the second sentence of the target "similarity"
SENTENCES = ("The cat sat on the mat.", "The dog sat on the mat.", "A cat was sitting on the rug.")


def _plain_encoder(lm: mhsa.engine.LoadedModel, text: str, reference: torch.Tensor) -> float:
    """One forward and backward of the plain encoder: cos(sentence embedding, reference)."""
    inputs = lm.tokenizer(text, return_tensors="pt").to(lm.device)
    embeddings = lm.model.get_input_embeddings()(inputs["input_ids"]).detach()
    embeddings.requires_grad_(True)
    hidden = lm.model(inputs_embeds=embeddings, attention_mask=inputs["attention_mask"])
    value = torch.cosine_similarity(hidden.last_hidden_state.mean(1)[0], reference, dim=0)
    value.backward()
    return float(value.detach())


def _switched_off(module: object, switch: str, fn):
    """``fn`` run with ``module.switch`` False (the code before that switch), then True again:
    ``circuits.TAPPED_GRADIENTS`` (EAP's gradients from the probe's copy of the residual per
    target), ``circuit_postnorm.COPIES_ONLY_WHERE_MIXED`` (every target's copy in every row)."""

    def run() -> None:
        setattr(module, switch, False)
        try:
            fn()
        finally:
            setattr(module, switch, True)

    return run


def _minilm(device: str, clock) -> None:
    """EAP and EAP-IG over MiniLM's edges against one forward+backward of the plain model."""
    lm = mhsa.load_model("default", device=device)
    clean, corrupted, pair = SENTENCES
    with torch.no_grad():
        inputs = lm.tokenizer(pair, return_tensors="pt").to(lm.device)
        reference = lm.model(**inputs).last_hidden_state.mean(1)[0]
    similarity = {"model": lm, "target": "similarity", "text_pair": pair}
    scores = mhsa.circuits.edge_attribution(clean, corrupted, method="eap", **similarity)
    edges = len(scores)

    def forwards() -> None:
        with torch.no_grad():
            for _ in range(10):
                lm.model(**lm.tokenizer(clean, return_tensors="pt").to(lm.device))
        if lm.device.type == "cuda":
            torch.cuda.synchronize()

    times = median_times(
        {
            "forward+backward": lambda: _plain_encoder(lm, clean, reference),
            "eap (similarity)": lambda: mhsa.circuits.edge_attribution(
                clean, corrupted, method="eap", **similarity
            ),
            "eap-ig (embedding, 5 steps)": lambda: mhsa.circuits.edge_attribution(
                clean, corrupted, model=lm, method="eap-ig"
            ),
            "10 forwards": forwards,
            "curve (10 sizes)": lambda: mhsa.circuits.faithfulness_curve(
                clean, corrupted, scores, **similarity
            ),
            "curve, every copy": _switched_off(
                circuit_postnorm,
                "COPIES_ONLY_WHERE_MIXED",
                lambda: mhsa.circuits.faithfulness_curve(clean, corrupted, scores, **similarity),
            ),
        },
        repeat=11,
        warmup=1,
        budget_s=120,
        clock=clock,
    )
    one = times["forward+backward"]
    tokens = len(lm.tokenizer(clean)["input_ids"])
    print(
        f"\nMiniLM (default, 6 x 12, width 384), {tokens} tokens: {edges} edges; "
        f"forward+backward {1000 * one:.1f} ms"
    )
    ten = times["10 forwards"]
    rows = [
        {"what": name, "ms": 1000 * t, "baseline": base, "ratio": t / ref, "target": target}
        for name, base, ref, target in (
            ("eap (similarity)", "forward+backward", one, "<= 3"),
            ("eap-ig (embedding, 5 steps)", "forward+backward", one, ""),
            ("curve (10 sizes)", "10 forwards", ten, "<= 1"),
            ("curve, every copy", "10 forwards", ten, ""),
            ("curve (10 sizes)", "curve, every copy", times["curve, every copy"], ""),
        )
        for t in [times[name]]
    ]
    print_table(rows, ["what", "ms", "baseline", "ratio", "target"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy:induction")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-gpt2", action="store_true", help="skip GPT-2 small's shape")
    parser.add_argument("--no-minilm", action="store_true", help="skip MiniLM (an encoder)")
    parser.add_argument(
        "--gpt2-tokens", type=int, nargs="+", default=[64], help="GPT-2 small's text lengths"
    )
    parser.add_argument(
        "--llama-1b-tokens",
        type=int,
        nargs="*",
        default=[],
        help="TinyLlama-1.1B's shape at these lengths (a GPU's work: 4.4 GB of float32 weights)",
    )
    parser.add_argument(
        "--cpu-time", action="store_true", help="time this process's CPU (steadier under load)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    lm = mhsa.load_model(args.model, device=args.device)
    clean, corrupted, answer, wrong = TOY
    kw = {"model": lm, "answer": answer, "wrong": wrong}
    scores = mhsa.circuits.edge_attribution(clean, corrupted, **kw)
    edges = len(scores)
    times = median_times(
        {
            "forward+backward": lambda: _plain(lm, clean, answer, wrong, True),
            "10 forwards": lambda: [_plain(lm, clean, answer, wrong, False) for _ in range(10)],
            "eap": lambda: mhsa.circuits.edge_attribution(clean, corrupted, **kw),
            "eap-ig (5 steps)": lambda: mhsa.circuits.edge_attribution(
                clean, corrupted, method="eap-ig", **kw
            ),
            "exact": lambda: mhsa.circuits.edge_attribution(clean, corrupted, method="exact", **kw),
            "curve (10 sizes)": lambda: mhsa.circuits.faithfulness_curve(
                clean, corrupted, scores, **kw
            ),
        },
        repeat=11,
        budget_s=60,
        clock=clock,
    )
    one, ten = times["forward+backward"], times["10 forwards"]
    rows = [
        {"what": name, "ms": 1000 * t, "baseline": base, "ratio": t / ref, "target": target}
        for name, t, base, ref, target in (
            ("eap", times["eap"], "forward+backward", one, "<= 3"),
            ("eap-ig (5 steps)", times["eap-ig (5 steps)"], "forward+backward", one, ""),
            ("exact", times["exact"], "forward+backward", one, ""),
            ("curve (10 sizes)", times["curve (10 sizes)"], "10 forwards", ten, "<= 1"),
        )
    ]
    print(
        f"{lm.display_name}: {edges} edges; forward+backward {1000 * one:.1f} ms, 10 forwards "
        f"{1000 * ten:.1f} ms"
    )
    print_table(rows, ["what", "ms", "baseline", "ratio", "target"])
    if not args.no_gpt2:
        for tokens in args.gpt2_tokens:
            _big(args.device, clock, tokens)
    for tokens in args.llama_1b_tokens:
        _big(args.device, clock, tokens, "llama-1b")
    if not args.no_minilm:
        _minilm(args.device, clock)


if __name__ == "__main__":
    main()
