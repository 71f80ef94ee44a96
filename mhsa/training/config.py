"""A training run's settings: ``TrainConfig`` (checked against the server's limits), the family
a task trains in by default, and the recipe of each shipped toy model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from mhsa.engine.models.limits import Limits
from mhsa.engine.models.loading import DEVICES
from mhsa.training.build import build_model
from mhsa.training.families import MODEL_FAMILIES, model_family
from mhsa.training.tasks import task_spec

__all__ = ["RECIPES", "TrainConfig", "default_family"]


def _ranges() -> dict[str, tuple[float, float]]:
    """Each numeric setting's allowed ``(lowest, highest)``; steps from the server's limits."""
    return {
        "layers": (1, 4),
        "heads": (1, 8),
        "width": (8, 256),
        "steps": (1, Limits.from_env().max_train_steps),
        "lr": (1e-5, 0.1),
        "batch": (1, 256),
        "warmup": (0, Limits.from_env().max_train_steps),
        "seed": (0, 2**31 - 1),
    }


@dataclass(frozen=True)
class TrainConfig:
    """One training run. The defaults are the shipped induction model's recipe.

    Attributes:
        task: a name in ``TASKS``.
        family: ``"llama"`` (rotary positions, RMSNorm, gated MLP) or ``"gpt2"`` (learned
            positions, LayerNorm).
        layers: transformer layers (1 to 4).
        heads: attention heads per layer (1 to 8).
        width: d_model (8 to 256), a multiple of ``heads`` (Llama: of ``2 * heads``, for the
            rotary pairs).
        mlp: train the feed-forward blocks; False fixes their outputs at zero (output weights
            zero and frozen: the saved model stays a normal model of its family), an
            attention-only model as in Olsson et al.
        steps: optimizer steps (at most ``MHSA_MAX_TRAIN_STEPS``).
        lr: AdamW's peak learning rate.
        batch: sequences per step.
        warmup: steps of linear warm-up before the cosine decay to a tenth of ``lr`` (a run
            shorter than its warm-up ends before reaching ``lr``).
        seed: the weights' initialisation and the data's order.
        device: ``"cpu"``, ``"cuda"``, ``"mps"`` or ``"auto"`` (bitwise reproducible on the CPU).
    """

    task: str = "induction"
    family: str = "llama"
    layers: int = 2
    heads: int = 4
    width: int = 64
    mlp: bool = False
    steps: int = 1000
    lr: float = 1e-3
    batch: int = 32
    warmup: int = 50
    seed: int = 0
    device: str = "cpu"

    def check(self) -> None:
        """Raise ValueError, naming the setting and its range, for any setting out of range."""
        spec = task_spec(self.task)
        family = model_family(self.family)
        if family.encoder_decoder != spec.encoder_decoder:
            kind = "an encoder-decoder" if spec.encoder_decoder else "a decoder-only"
            fits = ", ".join(
                f.name for f in MODEL_FAMILIES.values() if f.encoder_decoder == spec.encoder_decoder
            )
            raise ValueError(
                f"task {self.task!r} needs {kind} family ({fits}), not {self.family!r}."
            )
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {self.device!r}.")
        for name, (lo, hi) in _ranges().items():
            value = getattr(self, name)
            whole = isinstance(lo, int)
            kind = int if whole else int | float
            if isinstance(value, bool) or not isinstance(value, kind) or not lo <= value <= hi:
                what = "a whole number between" if whole else "between"
                raise ValueError(f"{name} must be {what} {lo} and {hi}, got {value!r}.")
        pairs = 2 if family.rotary else 1
        if self.width % (pairs * self.heads):
            raise ValueError(
                f"width must be a multiple of {pairs * self.heads} ({pairs} x heads) for "
                f"{self.heads} heads, got {self.width}."
            )
        cap = Limits.from_env().max_train_parameters
        n = sum(p.numel() for p in build_model(self, device="meta").parameters())
        if n > cap:
            raise ValueError(
                f"This model has {n:,} parameters, over MHSA_MAX_TRAIN_PARAMETERS ({cap:,}): "
                "choose fewer layers or a smaller width."
            )

    def changed(self) -> dict[str, Any]:
        """The settings that differ from the defaults (of this task: its ``default_family``)."""
        default = TrainConfig(task=self.task, family=default_family(self.task))
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


def default_family(task: str) -> str:
    """The family a ``task`` trains in unless told otherwise: ``TrainConfig``'s default, or for
    an encoder-decoder task the first encoder-decoder family."""
    if not task_spec(task).encoder_decoder:
        return TrainConfig.family
    return next(f.name for f in MODEL_FAMILIES.values() if f.encoder_decoder)


#: the recipe of each shipped toy model (``data/toy/<task>``; its card gives the command)
RECIPES: Mapping[str, TrainConfig] = MappingProxyType(
    {
        "induction": TrainConfig(),
        "copy": TrainConfig(task="copy"),
        "reverse": TrainConfig(task="reverse"),
        # sorting compares symbols: the feed-forward blocks are trained
        "sort": TrainConfig(task="sort", mlp=True),
        "reverse-seq2seq": TrainConfig(task="reverse-seq2seq", family="bart"),
    }
)
