"""The example texts each model brings, and how much of a text a model's tokenizer does not know.

The embedded default model's example is an English sentence; a toy model's (``toy:<task>``, or a
model trained here on a task) are sequences of its task, written as its word-level tokenizer
reads them (an English sentence is all ``[UNK]`` to it). A toy model's card lists them
(``mhsa.training.toy.model_card``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.training.tasks import Example, task_examples

__all__ = [
    "DEFAULT_EXAMPLES",
    "CrossOpening",
    "Example",
    "UnknownTokens",
    "cross_opening",
    "model_examples",
    "task_examples",
    "unknown_tokens",
]


#: the embedded default model's examples (the first is the app's default sentence)
DEFAULT_EXAMPLES: tuple[Example, ...] = (
    Example("The cat sat on the mat.", about="a short sentence: every head's pattern is readable"),
    Example(
        "The keys to the old cabinet are on the table.",
        about="a verb far from its subject: heads that link them",
    ),
    Example(
        "Alice gave Bob a book because Bob had asked Alice for one.",
        about="repeated names: heads that look back at the earlier mention",
    ),
)


def model_examples(name: str) -> tuple[Example, ...]:
    """The examples the model called ``name`` brings: the default model's
    (``DEFAULT_EXAMPLES``), a toy model's or a model trained here on a task (its task's,
    ``task_examples``); none for any other model (its own text is the user's)."""
    from mhsa.engine.models.trained import is_trained_name, trained_store
    from mhsa.training.toy import toy_task

    if name == DEFAULT_MODEL:
        return DEFAULT_EXAMPLES
    task = toy_task(name)
    if task is None and is_trained_name(name) and name in trained_store():
        task = trained_store().get(name).info.get("task")
    try:
        return task_examples(task) if isinstance(task, str) else ()
    except ValueError:
        return ()


@dataclass(frozen=True)
class UnknownTokens:
    """How much of a text a model's tokenizer does not know.

    Attributes:
        unknown: the text's tokens that are the tokenizer's unknown token (``[UNK]``).
        total: the text's tokens, the special tokens the tokenizer adds left out.
        token: the unknown token as the tokenizer writes it (None: it has none).
    """

    unknown: int
    total: int
    token: str | None

    @property
    def mostly_unknown(self) -> bool:
        """Over half of the text's tokens are unknown: what is shown says nothing of it."""
        return self.unknown * 2 > self.total > 0


def unknown_tokens(text: str, *, model: str | LoadedModel = DEFAULT_MODEL) -> UnknownTokens:
    """How many of ``text``'s tokens ``model``'s tokenizer does not know (a byte-level
    tokenizer has no unknown token: 0)."""
    lm = resolve_model(model)
    tok = lm.tokenizer
    with lm.lock:  # fast tokenizers are not re-entrant
        ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    unk = getattr(tok, "unk_token_id", None)
    unknown = 0 if unk is None else sum(1 for i in ids if i == unk)
    return UnknownTokens(unknown, len(ids), getattr(tok, "unk_token", None) if unk else None)


@dataclass(frozen=True)
class CrossOpening:
    """Where a shipped encoder-decoder toy model opens: on cross attention, its target written
    by the model (``generate`` tokens), at the decoder layer whose cross attention aligns most
    clearly (``layer``)."""

    generate: int
    layer: int


def cross_opening(name: str) -> CrossOpening | None:
    """How the shipped encoder-decoder toy model ``name`` opens (None for any other model): its
    first example's target length, and the layer of the head with the highest anti-diagonal
    score (``mhsa.training.anti_diagonal_scores``) on that example, teacher-forced."""
    from mhsa.engine.extract import attend
    from mhsa.training.scores import anti_diagonal_scores
    from mhsa.training.toy import toy_task

    task = toy_task(name)
    examples = model_examples(name) if task is not None else ()
    if not examples or examples[0].target is None:
        return None
    example = examples[0]
    result = attend(example.text, text_pair=example.target, model=name, engine="transformers")
    n = len(example.text.split())
    scores = anti_diagonal_scores(result.cross_attention, n)  # [layers, heads]
    return CrossOpening(generate=n, layer=int(scores.max(axis=1).argmax()))
