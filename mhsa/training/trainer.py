"""Train a small transformers model on a toy task, its attention running as our module.

The model is a standard ``LlamaForCausalLM`` or ``GPT2LMHeadModel`` (or, for an encoder-decoder
task, a ``BartForConditionalGeneration``). For the whole run its attention blocks are swapped for
our ``MultiHeadSelfAttention`` (the ``mhsa`` engine's swap, with gradients on our modules'
weights); at the end our weights are written back into the model's own blocks, so the result is
a normal transformers model that both engines run.

The trainer lives in five modules, read in this order (nanoGPT's ``train.py`` as the model of a
readable loop): ``config`` (the settings and the shipped recipes), ``build`` (the model, and the
model through our module), ``loop`` (the loop), ``probing`` (the evaluation every interval and
``evaluate``) and ``results`` (snapshots, the finished run). This module keeps every name it
held importable from here.
"""

from __future__ import annotations

from mhsa.training.build import (
    MAX_ENCODER_DECODER_POSITIONS,
    MAX_POSITIONS,
    as_loaded_model,
    build_model,
)
from mhsa.training.config import RECIPES, TrainConfig, default_family
from mhsa.training.loop import train
from mhsa.training.probing import evaluate
from mhsa.training.results import (
    PHASE_CHANGE_SCORE,
    Evaluation,
    TrainResult,
    TrainSnapshot,
)

__all__ = [
    "MAX_ENCODER_DECODER_POSITIONS",
    "MAX_POSITIONS",
    "PHASE_CHANGE_SCORE",
    "RECIPES",
    "Evaluation",
    "TrainConfig",
    "TrainResult",
    "TrainSnapshot",
    "as_loaded_model",
    "build_model",
    "default_family",
    "evaluate",
    "train",
]
