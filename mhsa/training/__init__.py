"""Heads that learn: toy tasks, training small transformers through our module, and the shipped
toy models (``data/toy/<task>/``, opened as ``toy:<task>``)."""

from mhsa.training.card import save_model
from mhsa.training.families import MODEL_FAMILIES, ModelFamily, model_family
from mhsa.training.scores import (
    HeadScores,
    anti_diagonal_scores,
    earlier_occurrence,
    head_scores,
)
from mhsa.training.tasks import (
    TASKS,
    TaskBatch,
    TaskSpec,
    make_tokenizer,
    probe,
    probe_batch,
    sample,
)
from mhsa.training.toy import TOY_PREFIX, is_toy_name, toy_model_path, toy_task
from mhsa.training.trainer import (
    PHASE_CHANGE_SCORE,
    RECIPES,
    Evaluation,
    TrainConfig,
    TrainResult,
    TrainSnapshot,
    as_loaded_model,
    build_model,
    default_family,
    evaluate,
    train,
)

__all__ = [
    "MODEL_FAMILIES",
    "PHASE_CHANGE_SCORE",
    "RECIPES",
    "TASKS",
    "TOY_PREFIX",
    "Evaluation",
    "HeadScores",
    "ModelFamily",
    "TaskBatch",
    "TaskSpec",
    "TrainConfig",
    "TrainResult",
    "TrainSnapshot",
    "anti_diagonal_scores",
    "as_loaded_model",
    "build_model",
    "default_family",
    "earlier_occurrence",
    "evaluate",
    "head_scores",
    "is_toy_name",
    "make_tokenizer",
    "model_family",
    "probe",
    "probe_batch",
    "sample",
    "save_model",
    "toy_model_path",
    "toy_task",
    "train",
]
