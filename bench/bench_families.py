"""Engine ``mhsa`` against the ``transformers`` engine, per family of issue 39 part B: median
time of ``mhsa.attend`` on a random model of that family (GPT-2-small-like width, 4 layers)
saved to a folder and opened by path, and their ratio. Target: at most 1.1x.

    OMP_NUM_THREADS=1 python -m bench.bench_families [tokens]

Both engines run in turn, round after round, in this process (``bench.common.median_times``);
CPU time of this process (``time.process_time``), steadier than wall time on a shared machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import sys
import tempfile
import time

import torch

import mhsa
from bench.common import engine_row, median_times, print_table

WIDTH = {"hidden": 768, "heads": 12, "layers": 4, "inner": 3072}


def _models() -> dict[str, object]:
    import transformers as tf

    w = WIDTH
    common = {"vocab_size": 30522, "max_position_embeddings": 1024}
    decoder = {
        **common,
        "hidden_size": w["hidden"],
        "num_attention_heads": w["heads"],
        "num_hidden_layers": w["layers"],
        "intermediate_size": w["inner"],
    }
    return {
        "GPT-NeoX (rotary_pct 0.25)": lambda: tf.GPTNeoXForCausalLM(
            tf.GPTNeoXConfig(**decoder, rotary_pct=0.25)
        ),
        "GPT-J (rotary_dim 64)": lambda: tf.GPTJForCausalLM(
            tf.GPTJConfig(
                vocab_size=30522,
                n_positions=1024,
                n_embd=w["hidden"],
                n_head=w["heads"],
                n_layer=w["layers"],
                rotary_dim=64,
            )
        ),
        "Phi (partial 0.5)": lambda: tf.PhiForCausalLM(
            tf.PhiConfig(**decoder, partial_rotary_factor=0.5)
        ),
        "OPT": lambda: tf.OPTForCausalLM(
            tf.OPTConfig(
                **common,
                hidden_size=w["hidden"],
                num_attention_heads=w["heads"],
                num_hidden_layers=w["layers"],
                ffn_dim=w["inner"],
                word_embed_proj_dim=w["hidden"],
            )
        ),
        "Falcon (multi-query)": lambda: tf.FalconForCausalLM(
            tf.FalconConfig(
                **common,
                hidden_size=w["hidden"],
                num_attention_heads=w["heads"],
                num_hidden_layers=w["layers"],
                alibi=False,
                multi_query=True,
            )
        ),
        "ALBERT (4 layers, 1 group)": lambda: tf.AlbertForMaskedLM(
            tf.AlbertConfig(
                **common,
                embedding_size=128,
                hidden_size=w["hidden"],
                num_attention_heads=w["heads"],
                num_hidden_layers=w["layers"],
                intermediate_size=w["inner"],
            )
        ),
    }


def _saved(build, folder: str) -> mhsa.engine.LoadedModel:
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    build().save_pretrained(folder)
    AutoTokenizer.from_pretrained(mhsa.engine.models.loading.default_model_path()).save_pretrained(
        folder
    )
    return mhsa.load_model(folder, device="cpu")


def main(tokens: int = 128) -> None:
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * tokens)
    rows = []
    for name, build in _models().items():
        with tempfile.TemporaryDirectory() as folder:
            lm = _saved(build, folder)
            t = median_times(
                {
                    "transformers": lambda: mhsa.attend(
                        text, model=lm, engine="transformers", max_tokens=tokens
                    ),
                    "mhsa": lambda: mhsa.attend(text, model=lm, engine="mhsa", max_tokens=tokens),
                },
                repeat=11,
                clock=time.process_time,
            )
        rows.append(engine_row(name, t, tokens=tokens))
        print(rows[-1], flush=True)
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
