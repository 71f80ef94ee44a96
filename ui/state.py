"""Every selection lives in st.session_state and is mirrored into the URL's query parameters,
so a link reopens exactly the same view. A bad parameter falls back to its default with a notice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import streamlit as st

from mhsa.engine.extract import ENGINES, MAX_NEW_TOKENS
from mhsa.engine.models.limits import Limits
from mhsa.engine.models.loading import DEVICES
from mhsa.engine.models.names import allowed_description
from mhsa.engine.models.trained import is_trained_name, trained_store
from mhsa.engine.result import ATTENTION_KINDS
from mhsa.engine.runs.selection import parse_indices
from mhsa.errors import MHSAError
from mhsa.heads import parse_layer_head_label
from ui.navigation import every_link_key

DEFAULT_TEXT = "The cat sat on the mat."
#: Longest value (percent-encoded bytes) a link carries: nginx's default request line is 8 KiB,
#: and the address bar holds every other parameter too.
MAX_LINK_VALUE_BYTES = 4000
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>$~:&=])")


#: GitHub-flavoured markdown turns bare URLs, www. names and e-mail addresses into links after
#: escapes are resolved; an invisible word joiner (U+2060) in each trigger stops that.
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?=@)", re.IGNORECASE)


def md_escape(text: object) -> str:
    """Text made literal inside Streamlit markdown (messages, captions, labels): every markdown
    character escaped, so no link, image, emphasis or HTML renders; bare URLs and e-mail
    addresses kept from becoming links; control characters shown as their code points."""
    clean = "".join(c if c.isprintable() or c in "\n\t" else f"U+{ord(c):04X}" for c in str(text))
    return _MD_SPECIAL.sub(r"\\\1", _AUTOLINK.sub("\u2060", clean))


def error(e: Exception) -> None:
    """``e``'s message as an error box, shown literally (no markdown read into it)."""
    st.error(md_escape(str(e)), icon=":material/block:")


def link_bytes(value: str) -> int:
    """Size of a value in a link (percent-encoded UTF-8)."""
    return len(quote(value, safe=""))


@dataclass(frozen=True)
class Param:
    """A state value: its default, a parser that raises ValueError on bad input, and the names
    it had in older links (``old_keys``: still read, so those links open the same view; the
    current name wins when a link has both, and the page's own link then uses it)."""

    default: Any
    parse: Callable[[str], Any]
    old_keys: tuple[str, ...] = ()

    def to_url(self, value: Any) -> str:
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, list | tuple):
            return ",".join(map(str, value))
        return str(value)


def choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return raw

    return parse


def whole_number(raw: str) -> int:
    """A whole number written in decimal digits (an optional sign, spaces around); the refusal
    in plain words, never Python's "invalid literal for int()"."""
    text = raw.strip()
    if not re.fullmatch(r"[+-]?[0-9]{1,20}", text):
        raise ValueError("is not a whole number")
    return int(text)


#: the widest position a link may name; the page then clamps it to what its result holds
MAX_INDEX = 1_000_000


def index_param(raw: str) -> int:
    """A position (a layer, head, step, token) from a link: a whole number; its range depends
    on the page's result, so the page clamps it there and says so (``clamp``), instead of a
    fixed range that names no model's."""
    value = whole_number(raw)
    if abs(value) > MAX_INDEX:
        raise ValueError(f"must be a whole number from -{MAX_INDEX:,} to {MAX_INDEX:,}")
    return value


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = whole_number(raw)
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value

    return parse


def flag(raw: str) -> bool:
    if raw not in ("0", "1", "true", "false"):
        raise ValueError("must be 0 or 1")
    return raw in ("1", "true")


def _head_order(label: str) -> tuple[int, int, int]:
    """Where a head label sorts: ``L`` (encoders, decoders), then an encoder-decoder's ``E``,
    ``D``, ``C`` heads, each by layer and head (raises ValueError on anything else)."""
    name, head = parse_layer_head_label(label)
    return "LEDC".index(name[0]), int(name[1:]), head


def heads_param(raw: str) -> list[str]:
    """Heads as labels, comma-separated (at most 256 of them): ``L{layer}H{head}``, or an
    encoder-decoder's ``E``, ``D``, ``C{layer}H{head}`` (whether the model has them is the
    page's to check)."""
    labels = [p.strip() for p in raw.split(",") if p.strip()]
    if len(labels) > 256:
        raise ValueError("names more than 256 heads")
    try:
        return sorted(set(labels), key=_head_order)  # parses, so checks, every label
    except ValueError:
        raise ValueError(
            "must be heads written as L<layer>H<head> (encoder-decoders: E, D or C<layer>H<head>), "
            "separated by commas"
        ) from None


def heads_list_param(raw: str) -> list[int]:
    """Head numbers, comma-separated (at most 256)."""
    heads = [whole_number(p) for p in raw.split(",") if p.strip()]
    if len(heads) > 256 or any(not 0 <= h <= 1023 for h in heads):
        raise ValueError("must be head numbers from 0 to 1023")
    return sorted(set(heads))


def head_label_param(raw: str) -> str:
    """One head as ``L{layer}H{head}`` (an encoder-decoder's as ``E0H1``, ``D0H1``, ``C0H1``;
    whether the model has it is the page's to check)."""
    try:
        layer, head = parse_layer_head_label(raw.strip())
    except ValueError:
        raise ValueError("must be a head written as L<layer>H<head>") from None
    return f"{layer[0]}{int(layer[1:])}H{head}"  # leading zeros dropped, as labels are written


def search_param(raw: str) -> str:
    if len(raw) > 200:
        raise ValueError("is longer than 200 characters")
    return raw


#: characters of a word typed or linked as an answer (Information flow)
MAX_WORD_CHARS = 50


def word_param(raw: str) -> str:
    """A word (an answer to attribute or patch towards): at most ``MAX_WORD_CHARS`` characters,
    on one line."""
    if len(raw) > MAX_WORD_CHARS:
        raise ValueError(f"is longer than {MAX_WORD_CHARS} characters")
    if "\n" in raw or "\r" in raw:
        raise ValueError("must be on one line")
    return raw


def text_param(raw: str) -> str:
    limit = Limits.from_env().max_chars
    if len(raw) > limit:
        raise ValueError(f"is longer than {limit:,} characters")
    return raw


def model_param(raw: str) -> str:
    """A model named in a link loads only if the operator allowed it (``MHSA_ALLOWED_MODELS``);
    the refusal says the same whether or not such a folder or model exists. A ``trained:<id>``
    model opens only while the server's store holds it (``mhsa.engine.models.trained``: with
    ``MHSA_STORE``, on every replica and after a restart; without, in the process that
    trained it)."""
    raw = raw.strip()
    if not raw or len(raw) > 300:
        raise ValueError("must be a model id or folder")
    limits = Limits.from_env()
    try:
        limits.check_model(raw)
    except MHSAError as e:
        raise ValueError(
            f"this server does not load it; it loads {allowed_description(limits)}"
        ) from e
    if is_trained_name(raw) and raw not in trained_store():
        raise ValueError(
            "this server no longer holds that trained model; the Train heads page trains it "
            "again from the link's settings and seed"
        )
    return raw


def indices_param(raw: str) -> str:
    """Layers or heads as a link gives them (``2``, ``0-7``, ``0-3,8``; empty: all): the form
    is checked here, the range against the model when the result is computed (an error there
    names the model's sizes)."""
    raw = raw.strip()
    if not raw:
        return ""
    if len(raw) > 200:
        raise ValueError("must be a short list of numbers or ranges, as 0-7")
    values = parse_indices(raw, "the value")  # InputError (a ValueError) if no such list
    return ",".join(map(str, values)) if values is not None and len(values) == 1 else raw


GLOBAL_PARAMS: dict[str, Param] = {
    "model": Param("default", model_param),
    "engine": Param("transformers", choice(*ENGINES)),
    "device": Param("auto", choice(*DEVICES)),
    "text": Param(DEFAULT_TEXT, text_param),
    "target_text": Param("", text_param),  # an encoder-decoder's decoder text ("": the sentence)
    "kind": Param("encoder", choice(*ATTENTION_KINDS)),  # an encoder-decoder's attention
    "words": Param(False, flag),
    "seed": Param(0, bounded_int(0, 2**31 - 1)),
    "export": Param("png", choice("png", "svg")),
    "generate": Param(0, bounded_int(0, MAX_NEW_TOKENS), old_keys=("gen",)),
    "sample": Param(False, flag),
    "find": Param("", search_param),
    "presentation": Param(False, flag, old_keys=("present",)),
    # long inputs: only these layers and heads are computed and kept (empty: all)
    "long_layers": Param("", indices_param),
    "long_heads": Param("", indices_param),
}


_LOADED = "_mhsa_query_loaded"
_NOTICES = "_mhsa_notices"
_LINKED = "_mhsa_linked"  # key -> "name=value" as the link gave it, until ``clamp`` checks it
#: link keys Streamlit itself reads
_STREAMLIT_KEYS = frozenset({"embed", "embed_options"})


def use_params(params: dict[str, Param]) -> None:
    """Make ``params`` live in session state: from the URL on a session's first run (with a
    notice for each bad value), then kept across page switches."""
    loaded: set[str] = st.session_state.setdefault(_LOADED, set())
    notices: list[str] = st.session_state.setdefault(_NOTICES, [])
    linked: dict[str, str] = st.session_state.setdefault(_LINKED, {})
    if not loaded:  # the session's first page: the link is the user's
        notices.extend(_unknown_keys(params))
    for key, param in params.items():
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]  # keep widget state across pages
            continue
        value = param.default
        name = None if key in loaded else _name_in_link(key, param)
        if name is not None:
            raw = st.query_params[name]
            shown = raw if len(raw) <= 40 else raw[:40] + "…"
            try:
                value = param.parse(raw)
                linked[key] = f"{name}={shown!r}"
            except Exception as e:  # any parse failure of any type: a link is hostile input
                notices.append(
                    f"Link parameter {name}={shown!r} ignored ({_plain_reason(e)}); using the "
                    f"default{_default_shown(param)}."
                )
        loaded.add(key)
        st.session_state[key] = value


def _unknown_keys(params: dict[str, Param]) -> list[str]:
    """A notice for each link key no page reads (``top=-5`` on Circuits, whose setting is
    ``circuit_n``): otherwise it would be ignored without a word. A key of another page is
    ignored quietly (a link whose path was edited)."""
    known = {name for key, param in params.items() for name in (key, *param.old_keys)}
    known |= every_link_key() | _STREAMLIT_KEYS  # another page's key: a link's path edited
    unknown = [name for name in st.query_params if name not in known]
    return [
        f"Link parameter {name if len(name) <= 40 else name[:40] + '…'!r} ignored: this page "
        "has no setting of that name."
        for name in unknown[:5]
    ]


#: Python's own words for a value it cannot convert: not for people
_PYTHON_WORDS = ("invalid literal", "could not convert", "base 10", "object", "NoneType")


def _plain_reason(e: Exception) -> str:
    """Why a link value was refused, in plain words: a parser's own ``ValueError`` message, or
    "not a valid value" for anything else (Python's conversion messages included)."""
    text = str(e).strip().rstrip(".") if isinstance(e, ValueError) else ""
    if not text or any(w in text for w in _PYTHON_WORDS):
        return "not a valid value"
    return text


def _default_shown(param: Param) -> str:
    """`` (0)``: the default a refused link value falls back to, when it is short and says
    something (not an empty text or list)."""
    default = param.default
    if isinstance(default, bool):
        return " (on)" if default else " (off)"
    value = param.to_url(default)
    if not value or len(value) > 40 or (isinstance(default, str) and " " in value):
        return ""
    return f" ({value})"


def _name_in_link(key: str, param: Param) -> str | None:
    """The name under which the URL holds ``param``: its own ``key``, else the first of its
    ``old_keys`` the URL has (a link made before the rename), else None."""
    return next((name for name in (key, *param.old_keys) if name in st.query_params), None)


def clamp(key: str, low: int, high: int) -> int:
    """Keep a numeric selection inside the range the current result allows; a value the link
    gave that falls outside it is moved with a warning naming the range (``layer=99`` on a
    6-layer model: "0 to 5; showing 5")."""
    value = st.session_state.get(key, low)
    from_link = st.session_state.get(_LINKED, {}).pop(key, None)
    if not isinstance(value, int) or not low <= value <= high:
        value = min(max(int(value) if isinstance(value, int) else low, low), high)
        st.session_state[key] = value
        if from_link is not None:
            st.warning(
                md_escape(
                    f"Link parameter {from_link} is outside what this page can show here "
                    f"({low} to {high}); showing {value}."
                ),
                icon=":material/warning:",
            )
    return value


def sync_url(params: dict[str, Param]) -> list[str]:
    """Write the non-default values of ``params`` into the URL, leaving out any value too long
    to travel in a link. Returns the keys left out."""
    wanted, too_long = {}, []
    for key, param in params.items():
        if key in st.session_state and st.session_state[key] != param.default:
            value = param.to_url(st.session_state[key])
            if link_bytes(value) > MAX_LINK_VALUE_BYTES:
                too_long.append(key)
            else:
                wanted[key] = value
    if dict(st.query_params) != wanted:
        st.query_params.from_dict(wanted)
    return too_long


def add_notice(message: str) -> None:
    """A notice shown under the next page title (``show_notices``), escaped there."""
    st.session_state.setdefault(_NOTICES, []).append(message)


#: more notices than this are listed in a collapsed box under one line that counts them
NOTICES_SHOWN = 3


def show_notices() -> None:
    """Every notice of this run in one box (a hostile link can refuse a dozen values: one box
    each stacked them over the figure), one line each; more than ``NOTICES_SHOWN`` are counted
    in the box and listed in a collapsed expander under it."""
    messages = st.session_state.pop(_NOTICES, [])
    if not messages:
        return
    lines = "  \n".join(md_escape(m) for m in messages)  # a hard line break between notices
    if len(messages) <= NOTICES_SHOWN:
        st.warning(lines, icon=":material/warning:")
        return
    st.warning(
        f"{len(messages)} values of the link or the settings fell back (listed below).",
        icon=":material/warning:",
    )
    with st.expander(f"The {len(messages)} values that fell back"):
        st.markdown(lines)
