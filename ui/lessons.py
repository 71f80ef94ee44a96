"""Short lessons for a class, and the recommended order of the pages: plain data, read by the
Lessons page and the Overview (no Streamlit here, so tests read it cheaply).

A step is one sentence and a link that opens a page with everything set (model, text, layer,
test) through the pages' own link keys (``ui.state.Param``; a link opens a fresh session, which
reads them). Every link names only the embedded default model or a shipped toy model, so the
lessons work offline, in the Docker image too.

A step that states a fact about its page's figure (a head's role, a ranking, a comparison)
carries that fact as data, a ``Claim``: a measure of the values the page computes
(``ui.views.lessons.MEASURES``), the head or layer it is about, and the bounds the sentence
promises. The sentence is a template whose fields ``{0}``, ``{1}``... are those claims'
measured values: the Lessons page renders it from the numbers the check reads
(``ui.views.lessons.step_sentence``), and a step whose claim does not hold on them says so
instead of its sentence. ``tests/app/test_lessons.py`` opens every step's link and checks each
claim on what the page computed, so a sentence cannot drift away from its figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import inf
from urllib.parse import urlencode

from mhsa.examples import DEFAULT_EXAMPLES, model_examples
from ui.navigation import PAGES

__all__ = [
    "LESSONS",
    "PAGE_GUIDE",
    "Claim",
    "Lesson",
    "Step",
    "guide_markdown",
    "page_title",
    "step_link",
]


@dataclass(frozen=True)
class Claim:
    """A fact a step's sentence states about its page, as data a test checks.

    Attributes:
        measure: the name of a measure of the page's values (``ui.views.lessons.MEASURES``).
        subject: the head (``L0H2``) or layer (``L1``: its heads) it is about; "" for none.
        at_least: the measure is at least this.
        at_most: and at most this.
        equals: or, for a measure that is a name (a step's, a head's), exactly this.
    """

    measure: str
    subject: str = ""
    at_least: float = -inf
    at_most: float = inf
    equals: str | None = None


@dataclass(frozen=True)
class Step:
    """One step of a lesson.

    Attributes:
        says: the explanation, one sentence; ``{0}``, ``{1}``... stand for the measured values
            of ``claims`` (in their order), filled in when the page renders it.
        page: the page's address (``AppPage.url_path``: ``Heads``).
        settings: link keys and values the page opens with (``model``, ``text``, ``layer``...).
        claims: the facts ``says`` states about the page's figure, checked by a test on what
            the page computes.
    """

    says: str
    page: str
    settings: dict[str, str] = field(default_factory=dict)
    claims: tuple[Claim, ...] = ()


@dataclass(frozen=True)
class Lesson:
    """A lesson: a title, what it is for in one line, and a few steps."""

    title: str
    goal: str
    steps: tuple[Step, ...]


def step_link(step: Step) -> str:
    """The step's link, relative to the app's root page (``Heads?model=default&layer=2``): it
    works wherever the app is served, under a path prefix too."""
    query = urlencode(step.settings)
    return f"{step.page}?{query}" if query else step.page


_DEFAULT = {"model": "default", "text": DEFAULT_EXAMPLES[0].text}
_INDUCTION = model_examples("toy:induction")[0].text
_REVERSE = model_examples("toy:reverse-seq2seq")[0]
_TOY = {"model": "toy:induction", "text": _INDUCTION}
_SEQ2SEQ = {"model": "toy:reverse-seq2seq", "text": _REVERSE.text}
_TOY_ATLAS = {"model": "toy:induction", "atlas": "toy-induction"}
_MINILM_ATLAS = {"model": "default", "atlas": "minilm-brown"}


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        "Where heads look",
        "Read an attention heatmap, and see that heads of one model look in different ways.",
        (
            Step(
                "Each row is a token asking where to look; this head spreads its attention "
                "over the whole sentence: its rows' entropy is {0} of a uniform row's.",
                "Heads",
                {**_DEFAULT, "layer": "0", "head": "0"},
                (Claim("entropy share", "L0H0", at_least=0.8),),
            ),
            Step(
                "This head puts {0} of its attention on the token just before: a "
                "previous-token head.",
                "Heads",
                {**_DEFAULT, "layer": "0", "head": "2"},
                (Claim("previous-token share", "L0H2", at_least=0.9),),
            ),
            Step(
                "The line view draws the same weights as lines from each token to the ones it "
                "reads.",
                "Line_view",
                {**_DEFAULT, "layer": "0", "line_heads": "2"},
            ),
            Step(
                "Head statistics measure every head; on the map of attention to the previous "
                "token, L0H2 ranks {0} of all the heads.",
                "Head_statistics",
                {**_DEFAULT, "stat": "to_prev"},
                (Claim("previous-token rank", "L0H2", at_most=1),),
            ),
        ),
    ),
    Lesson(
        "Inside one head",
        "Follow one head's computation from its input to its output, one step at a time.",
        (
            Step(
                "A layer starts from its input X, one row per token; step forward with the "
                "buttons.",
                "Inside_MHSA",
                {**_DEFAULT, "pretrained_layer": "0", "step": "0"},
                (Claim("step", equals="X"),),
            ),
            Step(
                "Queries meet keys: the raw scores, one number per pair of tokens.",
                "Inside_MHSA",
                {**_DEFAULT, "pretrained_layer": "0", "step": "7"},
                (Claim("step", equals="raw scores"),),
            ),
            Step(
                "The softmax turns each row of scores into weights that sum to 1: the attention "
                "pattern.",
                "Inside_MHSA",
                {**_DEFAULT, "pretrained_layer": "0", "step": "10"},
                (Claim("step", equals="probabilities"),),
            ),
            Step(
                "The same steps in untrained weights: no head has learnt to focus yet, so in "
                "every head a query's strongest key gets, on average over the queries, at most "
                "{1} of its weight.",
                "Inside_MHSA",
                {**_DEFAULT, "source": "fresh", "step": "10"},
                (Claim("step", equals="probabilities"), Claim("largest weight", at_most=0.5)),
            ),
        ),
    ),
    Lesson(
        "Heads that learn",
        "Train a tiny model on a repeated sequence and watch an induction head appear.",
        (
            Step(
                "Train a 2-layer model to continue a repeated sequence; the curve jumps when "
                "the induction head forms.",
                "Train_heads",
                {"task": "induction"},
            ),
            Step(
                "The shipped model after that training: in layer 1, each token of the repeat "
                "puts {0} of its attention, on average, on the token after its earlier copy.",
                "Heads",
                {**_TOY, "layer": "1", "head": "3"},
                (Claim("induction on the repeat", "L1H3", at_least=0.7),),
            ),
            Step(
                "Its layer 0 holds the other half of the circuit: this head, {1} of its layer by "
                "the previous-token test, puts {0} of its attention on the previous token, the "
                "one the induction heads match on.",
                "Heads",
                {**_TOY, "layer": "0", "head": "3"},
                (
                    Claim("previous-token share", "L0H3", at_least=0.5),
                    Claim("detection rank in layer", "L0H3", at_most=1),
                ),
            ),
        ),
    ),
    Lesson(
        "What a head does",
        "Name heads by what they do, with the tests the field uses.",
        (
            Step(
                "The induction test on repeated random tokens: the top head, {0}, scores {1}, "
                "and the top heads' maps show the induction stripe.",
                "Head_roles",
                {**_TOY, "detector": "induction", "random_tokens": "1"},
                (
                    Claim("top detected head", equals="L1H3"),
                    Claim("detection score", "L1H3", at_least=0.5),
                ),
            ),
            Step(
                "The previous-token test on the model's own example ranks {0} first, with a "
                "score of {1}.",
                "Head_roles",
                {**_TOY, "detector": "previous token"},
                (
                    Claim("top detected head", equals="L0H3"),
                    Claim("detection score", "L0H3", at_least=0.5),
                ),
            ),
            Step(
                "An encoder-decoder reversing its input: in cross attention layer 1, the decoder "
                "reads the source backwards (an anti-diagonal score of {0}).",
                "Heads",
                {
                    **_SEQ2SEQ,
                    "target_text": _REVERSE.target or "",
                    "kind": "cross",
                    "layer": "1",
                },
                (Claim("anti-diagonal", "L1", at_least=0.5),),
            ),
        ),
    ),
    Lesson(
        "Which heads carry an answer",
        "Knock heads out and patch them, and see which ones the output needs.",
        (
            Step(
                "Switch each head off in turn: the map colours each head by how much the output "
                "moves.",
                "Head_importance",
                {**_DEFAULT},
            ),
            Step(
                "Patching copies one head from a clean run into a corrupted one: the heads "
                "that restore the output carry the difference.",
                "Patching",
                {**_DEFAULT},
            ),
            Step(
                "On the induction model, measured by the loss on the repeat: each layer-1 head "
                "alone moves it by at most {0}, but the pruning curve jumps by {1} once all four "
                "are off.",
                "Head_importance",
                {**_TOY, "target": "repeat-loss"},
                (
                    Claim("largest importance", "L1", at_most=0.05),
                    Claim("pruning jump", "L1", at_least=1.0),
                ),
            ),
        ),
    ),
    Lesson(
        "What does this head do?",
        "Explain a head by a small program, scored on texts the search never saw, and test "
        "your own.",
        (
            Step(
                "The search over programs explains toy:induction's L0H3 mostly by {0}, the "
                "previous token: on the atlas's held-out texts the head's strongest key is one "
                "its program names for {1} of the queries.",
                "Head_atlas",
                {**_TOY_ATLAS, "atlas_head": "L0H3"},
                (
                    Claim("explanation's main part", "L0H3", equals="offset(-1)"),
                    Claim("explanation accuracy", "L0H3", at_least=0.9),
                ),
            ),
            Step(
                "Its layer-1 head L1H3 is explained by {0}, the token after an earlier copy "
                "of the query's token, and beats the best fixed program's accuracy by {1}.",
                "Head_atlas",
                {**_TOY_ATLAS, "atlas_head": "L1H3"},
                (
                    Claim("explanation's main part", "L1H3", equals="induction"),
                    Claim("accuracy over the baseline", "L1H3", at_least=0.2),
                ),
            ),
            Step(
                "A real model: typed into the hypothesis box, offset(-1) explains MiniLM's "
                "L0H2 too, its strongest key being the previous token for {0} of the queries.",
                "Head_atlas",
                {**_MINILM_ATLAS, "atlas_head": "L0H2", "explain_program": "offset(-1)"},
                (Claim("hypothesis accuracy", "L0H2", at_least=0.8),),
            ),
            Step(
                "Now your own hypothesis: offset(1), the next token, explains the same head "
                "for only {0} of the queries; change the box and compare.",
                "Head_atlas",
                {**_MINILM_ATLAS, "atlas_head": "L0H2", "explain_program": "offset(1)"},
                (Claim("hypothesis accuracy", "L0H2", at_most=0.2),),
            ),
        ),
    ),
)

#: every page in the order a first visit takes them, each with what it is for in one line
PAGE_GUIDE: tuple[tuple[str, str], ...] = (
    ("", "the tokens as the model sees them, and the model's facts"),
    ("Lessons", "short lessons, each step a link that opens a page set up for it"),
    ("Heads", "one head's attention as a heatmap; every head of a layer; a token's focus"),
    ("Line_view", "the same weights as lines between tokens"),
    (
        "Head_atlas",
        "one head over a whole corpus: what it does as a program, its strongest pairs, a search",
    ),
    ("Inside_MHSA", "one head's computation step by step, from X to the output"),
    ("Head_statistics", "every head measured: entropy, distance, previous / next / self"),
    ("Head_similarity", "which heads look alike, as a map and clusters"),
    ("Head_roles", "heads named by the field's tests: previous token, induction"),
    ("Train_heads", "train a tiny model and watch its heads form"),
    ("Head_importance", "knock heads out: which ones the output needs"),
    ("Patching", "copy heads from a clean run into a corrupted one"),
    ("Information_flow", "how the answer is built, layer by layer (causal language models)"),
    ("Circuits", "which edges between heads carry an answer, and how faithful a circuit is"),
    ("Rollout", "attention followed through every layer"),
    ("Compare", "two sentences side by side"),
)


def page_title(url_path: str) -> str:
    """The navigation title of the page at ``url_path``."""
    return next(p.title for p in PAGES if p.url_path == url_path)


def guide_markdown() -> str:
    """``PAGE_GUIDE`` as a numbered markdown list: each page's title in bold, linked, and what
    it is for (plain text of this module: nothing to escape)."""
    return "\n".join(
        f"{n}. [**{page_title(path)}**]({path or './'}): {about}"
        for n, (path, about) in enumerate(PAGE_GUIDE, 1)
    )


def steps_markdown(
    lesson: Lesson, escape: Callable[[str], str], sentence: Callable[[Step], str]
) -> str:
    """A lesson's steps as a numbered markdown list: each sentence (``sentence`` renders a
    step's from its page's numbers, ``ui.views.lessons.step_sentence``; through ``escape``, the
    UI's markdown escaping) and a link that opens its page set up for it."""
    return "\n".join(
        f"{i}. {escape(sentence(step))} [Open {page_title(step.page)} →]({step_link(step)})"
        for i, step in enumerate(lesson.steps, 1)
    )
