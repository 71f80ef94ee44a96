"""What a head does, in words: attention programs that explain heads, and their scores.

A program (``programs``: ``offset(-1)``, ``induction``, ``when(NOUN, pos(DET, left, nearest))
| first`` ...) maps a text to an attention pattern; ``parse_program`` reads one,
``str(program)`` writes it back, ``program.describe()`` says it in a sentence and
``program_pattern`` draws it on a text. ``scores`` holds how a pattern explains a head's
attention (soft IoU, Clark et al.'s accuracy, Transformer Debugger's ROC-AUC); ``attention``
runs an atlas's model once over the texts scored; ``search`` finds each head's best program;
``faithfulness`` replaces heads' patterns by programs' in the real forward pass;
``explanations`` explains every head of an atlas (``explain_heads``), scores one typed
hypothesis (``score_program``), gives a head's attention beside a program's pattern on one text
(``pattern_example``) and keeps the result beside the atlas (``saved``).

May import: ``mhsa.engine``, ``mhsa.analysis``, ``mhsa.causal``, ``mhsa.corpus``,
``mhsa.atlas`` and the shared top-level modules (``tests/test_layers.py``).
"""

from mhsa.explain.explanations import (
    HeadExplanations,
    PatternExample,
    explain_heads,
    pattern_example,
    saved,
    score_program,
)
from mhsa.explain.programs import (
    Atom,
    Fallback,
    Mix,
    Offset,
    Pos,
    Program,
    ProgramError,
    TextFeatures,
    When,
    parse_program,
    program_pattern,
)
from mhsa.explain.scores import accuracy, auc, soft_iou

__all__ = [
    "Atom",
    "Fallback",
    "HeadExplanations",
    "Mix",
    "Offset",
    "PatternExample",
    "Pos",
    "Program",
    "ProgramError",
    "TextFeatures",
    "When",
    "accuracy",
    "auc",
    "explain_heads",
    "parse_program",
    "pattern_example",
    "program_pattern",
    "saved",
    "score_program",
    "soft_iou",
]
