"""Tables of an attention result for people to read (the Overview page, the command line): its
tokens as the model sees them, and our module's agreement with the model's own forward."""

from __future__ import annotations

import pandas as pd

from mhsa.engine.result import AttentionResult

__all__ = ["agreement_table", "token_table"]


def token_table(result: AttentionResult) -> pd.DataFrame:
    """The tokens as the model sees them: one column per token, rows token, special,
    punctuation, generated, start, end (as text: one type per column for Arrow). An
    encoder-decoder's decoder tokens (``result.kind`` ``decoder``): token, special,
    punctuation (they have no place in the sentence's characters)."""
    if result.kind == "decoder":
        frame = pd.DataFrame(
            {"token": result.tokens, "special": result.special, "punctuation": result.punctuation}
        )
        return frame.T.astype(str)
    frame = pd.DataFrame(
        {
            "token": result.tokens,
            "special": result.special,
            "punctuation": result.punctuation,
            "generated": result.generated,
            "start": [o[0] for o in result.offsets],
            "end": [o[1] for o in result.offsets],
        }
    )
    return frame.T.astype(str)


def agreement_table(result: AttentionResult) -> pd.DataFrame:
    """Our module against the model's own forward (a result of the ``mhsa`` engine, verified):
    the largest difference per layer's attention and of the final hidden state (an
    encoder-decoder: each attention of each layer, and both stacks' outputs)."""
    if result.decoder_layer_max_abs_diff is None or result.cross_layer_max_abs_diff is None:
        return pd.DataFrame(
            {
                "compared": [f"layer {i} attention weights" for i in range(result.num_layers)]
                + ["final hidden state (the model's output)"],
                "max |ours - model|": [*result.layer_max_abs_diff, result.hidden_max_abs_diff],
            }
        )
    rows = [  # an encoder-decoder: each attention of each layer, both stacks' outputs
        (f"{kind} layer {i} attention weights", diff)
        for kind, diffs in [
            ("encoder", result.layer_max_abs_diff),
            ("decoder", result.decoder_layer_max_abs_diff),
            ("cross", result.cross_layer_max_abs_diff),
        ]
        for i, diff in enumerate(diffs)
    ]
    rows += [
        ("encoder's final hidden state", result.encoder_hidden_max_abs_diff),
        ("decoder's final hidden state (the model's output)", result.hidden_max_abs_diff),
    ]
    return pd.DataFrame(rows, columns=["compared", "max |ours - model|"])
