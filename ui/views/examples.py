"""Each model's own example texts in the sidebar: a sentence a model cannot read (over half of
it unknown tokens, as an English sentence is to a toy model) is swapped for the model's example
when the model is first opened, and every page says how many tokens are unknown, with a
one-click switch to the example (``mhsa.examples``)."""

from __future__ import annotations

import functools

import streamlit as st

import mhsa
from mhsa.examples import (
    CrossOpening,
    Example,
    UnknownTokens,
    cross_opening,
    model_examples,
    unknown_tokens,
)
from ui import core
from ui.state import add_notice, md_escape

__all__ = ["example_picker", "fit_sentence_to_model", "unknown_notice"]

#: the model the sidebar's sentence was last fitted to (a new one is fitted once)
_FITTED = "_mhsa_sentence_fitted_to"


@functools.lru_cache(maxsize=512)
def _unknown(model: str, device: str, text: str) -> UnknownTokens:
    """``unknown_tokens`` of the sidebar's text, once per (model, device, text) per process:
    a rerun costs a dictionary lookup, not a tokenization."""
    return unknown_tokens(text, model=core.loaded_model(model, device))


def counted(model: str, device: str, text: str) -> UnknownTokens | None:
    """The text's unknown tokens for the model, None when it does not load (the page says
    why) or the text is not one (empty: the page says so)."""
    if not text.strip():
        return None
    try:
        return _unknown(model, device, text)
    except mhsa.MHSAError:
        return None


def _use(example: Example) -> None:
    """Put ``example`` in the sidebar (a button's callback: before the widgets are drawn)."""
    st.session_state["text"] = example.text
    st.session_state["target_text"] = example.target or ""


def fit_sentence_to_model() -> None:
    """On a session's first page (unless its link carries a sentence) and whenever the
    sidebar's model changes: a sentence the model cannot read (over half unknown tokens) is
    replaced by the model's first example, with a notice saying so when the sentence was the
    user's (not on a first page, whose default sentence nobody typed). Call before the
    sidebar's widgets are drawn."""
    state = st.session_state
    model = state["model"].strip() or "default"
    if state.get(_FITTED) == model:
        return
    first = _FITTED not in state
    state[_FITTED] = model
    if first and "text" in st.query_params:  # a link's own sentence: kept, and counted
        return
    _open_on_cross_attention(model)
    examples = model_examples(model)
    found = counted(model, state["device"], state["text"]) if examples else None
    if found is None or not found.mostly_unknown:
        return
    _use(examples[0])
    if first:  # a link that names the model and no sentence: the example is the opening
        return
    add_notice(
        f"The sentence was {found.unknown} of {found.total} unknown tokens ({found.token}) for "
        f"{model}: the sidebar now holds the model's own example (its other examples are "
        "under the model box)."
    )


@functools.lru_cache(maxsize=16)
def _cross_opening(model: str) -> CrossOpening | None:
    return cross_opening(model)


def _open_on_cross_attention(model: str) -> None:
    """A shipped encoder-decoder toy model opens where it teaches: cross attention, the target
    written by the model, the layer that aligns most clearly (unless the link says otherwise)."""
    try:
        opening = _cross_opening(model)
    except mhsa.MHSAError:
        return
    if opening is None:
        return
    state = st.session_state
    linked = set(st.query_params)
    for key, value in (
        ("kind", "cross"),
        ("generate", opening.generate),
        ("layer", opening.layer),
        ("pretrained_layer", opening.layer),
        ("cross", True),
    ):
        if key not in linked:
            state[key] = value


def _say_unknown(found: UnknownTokens, message: str, little: str) -> None:
    """``message`` as an info line, or a warning ending in ``little`` when most of the text's
    tokens are unknown."""
    if found.mostly_unknown:
        st.warning(md_escape(f"{message} {little}"), icon=":material/warning:")
    else:
        st.info(md_escape(message), icon=":material/info:")


def unknown_notice(model: str, device: str, text: str) -> None:
    """How many of the sentence's tokens the model does not know (a warning when over half),
    and a button putting the model's example in the sidebar."""
    found = counted(model, device, text)
    if found is None or found.unknown == 0:
        return
    _say_unknown(
        found,
        f"{found.unknown} of the sentence's {found.total} tokens are unknown to {model} "
        f"(shown as {found.token}): the model sees one placeholder for each of them.",
        "What it shows says little about the sentence.",
    )
    examples = model_examples(model)
    if examples:
        st.button(
            "Use the model's example",
            key="use-model-example",
            on_click=_use,
            args=(examples[0],),
            help=md_escape(f"Puts in the sidebar: {examples[0].text}"),
        )


def unknown_line(model: str, device: str, text: str, what: str) -> None:
    """How many of ``what``'s tokens (a page's own text box: Compare's second sentence, the
    patching pages' clean and corrupted texts) the model does not know, in one line (a warning
    when over half); nothing when it knows them all."""
    found = counted(model, device, text)
    if found is None or found.unknown == 0:
        return
    _say_unknown(
        found,
        f"{what}: {found.unknown} of its {found.total} tokens are unknown to {model} (shown as "
        f"{found.token}).",
        "What the page shows says little about it.",
    )


#: what a page's own example pair sets: its texts and answers (the link's other values stay)
_PAIR_KEYS = ("clean", "corrupted", "answer", "wrong")


def own_pair_first(model: str, examples: dict, defaults: dict) -> None:
    """A patching page opened on a model that has its own example among the page's
    (``examples``: button name -> settings with ``model``) starts from that example, not from
    the page's English defaults (``defaults``: the clean and corrupted texts), which a toy
    model reads as unknown tokens. Texts the user or the link changed are kept. Call before
    the page's widgets are drawn."""
    state = st.session_state
    if any(state.get(key) != value for key, value in defaults.items()):
        return
    own = next((v for v in examples.values() if v.get("model") == model), None)
    if own is None or all(own.get(key) == value for key, value in defaults.items()):
        return
    state.update({k: own[k] for k in _PAIR_KEYS if k in own})


_PICKED = "model_example"


def _picked(examples: tuple[Example, ...]) -> None:
    """The picker's callback: its example into the sidebar, the picker back to its prompt."""
    index = st.session_state.get(_PICKED)
    if isinstance(index, int) and 0 <= index < len(examples):
        _use(examples[index])
    st.session_state[_PICKED] = None


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def example_picker(model: str) -> None:
    """A sidebar menu of the model's examples (none for a model that brings none)."""
    examples = model_examples(model)
    if not examples:
        return
    st.selectbox(
        "The model's examples",
        range(len(examples)),
        index=None,
        key=_PICKED,
        placeholder="Put one in the sentence box…",
        format_func=lambda i: (
            examples[i].text if len(examples[i].text) <= 60 else examples[i].text[:59] + "…"
        ),
        on_change=_picked,
        args=(examples,),
        help="What the model was made for: "
        + md_escape(examples[0].about or "its own kind of text"),
    )
