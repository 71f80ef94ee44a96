"""AttentionResult: the one immutable value every view reads."""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mhsa.engine.tokens import is_punctuation, word_groups
from mhsa.errors import InputError, MHSAError
from mhsa.heads import head_label

__all__ = [
    "ARRAY_FIELDS",
    "ATTENTION_KINDS",
    "AttentionResult",
    "NotebookView",
    "html_view",
    "set_html_view",
]

_FORMAT = "mhsa-explorer/attention-result"
_FORMAT_VERSION = 1
#: the fields that hold arrays (saved as arrays, counted in bytes, frozen when shared)
ARRAY_FIELDS = ("attention", "cross_attention", "decoder_attention", "norms", "q", "k")
#: the attentions of an encoder-decoder model (``AttentionResult.of_kind``): the encoder's
#: self-attention, the decoder's (causal) self-attention, and the decoder's cross-attention to
#: the encoder (queries: decoder tokens; keys: encoder tokens)
ATTENTION_KINDS = ("encoder", "decoder", "cross")
#: draws a value as one self-contained piece of HTML, by kind: ``"attention"`` (an
#: ``AttentionResult``: ``(result, view, **options) -> str``, ``mhsa.plots.notebook``), and the
#: results of the layers above (``"patching agreement"``, ``"path patch"``, ``"circuit graph"``,
#: ``"atlas"``, ``"atlas parts"``, ``"faithfulness curve"``: ``(value) -> str``,
#: ``mhsa.plots.notebook_results``). The front
#: (``mhsa/__init__.py``) sets them: the figures sit above the engine and the analyses.
_html_views: dict[str, Callable[..., str]] = {}


def set_html_view(draw: Callable[..., str], kind: str = "attention") -> None:
    """Make ``draw`` the function that draws ``kind`` (``"attention"``: what
    ``AttentionResult.show``, ``_repr_html_`` and ``to_html`` call)."""
    _html_views[kind] = draw


def html_view(kind: str) -> Callable[..., str]:
    """The function that draws ``kind`` as HTML (``set_html_view``).

    Raises:
        MHSAError: none is set (``mhsa`` was not imported).
    """
    draw = _html_views.get(kind)
    if draw is None:
        raise MHSAError(f"No notebook view of {kind} is set: import mhsa (it sets them).")
    return draw


@dataclass(frozen=True)
class NotebookView:
    """A result's view as HTML: a notebook shows it where a cell ends with it (or through
    ``IPython.display.display``); ``html`` is the markup."""

    html: str

    def _repr_html_(self) -> str:
        return self.html


@dataclass(frozen=True, eq=False)
class AttentionResult:
    """Per-head attention of one text through one model and engine.

    Attributes:
        text: the input text (after truncation, the text is still the full input).
        tokens: token strings as the model sees them.
        attention: ``[layers, heads, n, n]`` (encoder/decoder self-attention), float32, or
            float16 when ``attend(attention_dtype=...)`` asked for 16 bits; only the selected
            layers and heads when ``layer_ids`` / ``head_ids`` say so.
        offsets: character span of each token in ``text``; ``(0, 0)`` for special tokens.
        special: special-token flags ([CLS], [SEP], BOS/EOS).
        punctuation: punctuation flags.
        word_ids: word index of each token, -1 for special tokens.
        model: model name; engine: ``transformers`` | ``mhsa`` | ``mhsa-random``; device: where
            it ran; num_parameters: of the model.
        timings: seconds, ``{"load": ..., "forward": ...}`` (plus ``"verify"``: the model's own
            forward that ``verify=True`` adds).
        causal: the model masks attention to later tokens.
        truncated_tokens: tokens dropped to respect ``max_tokens`` / the model's limit.
        max_abs_diff: for the ``mhsa`` engine run with ``verify=True``, the largest absolute
            difference between the attention weights of the model run through our module and
            of the model's own forward, over every layer, head and token pair.
        layer_max_abs_diff: the same, per layer.
        hidden_max_abs_diff: the largest absolute difference of the final hidden state (the
            model's output; the decoder's for encoder-decoder models) between the two forward
            passes.
        decoder_layer_max_abs_diff, cross_layer_max_abs_diff, encoder_hidden_max_abs_diff:
            encoder-decoder models through our module with ``verify=True``: the same per
            decoder self-attention layer, per cross-attention layer, and of the encoder's final
            hidden state (``layer_max_abs_diff`` is the encoder's; ``max_abs_diff`` covers all).
        facts: the model's layers, heads, d_model, d_head, parameters, type, max positions and
            device (``LoadedModel.facts``), so that views need not go back to the model.
        prompt_chars: for text a model generated (``mhsa.engine.attend_generated``), where the
            generated characters begin; tokens whose span starts there or later are
            ``generated`` (special tokens the model wrote included: their span is zero-width
            where they were written).
        seed: for ``mhsa-random``, the seed of the fresh weights.
        word_level: tokens were merged into words by ``to_words``.
        decoder_tokens, decoder_attention ``[layers, heads, m, m]``, cross_attention
            ``[layers, heads, m, n]``: encoder-decoder models only.
        norms: float32 ``[layers, heads, n, n]``, ``attention`` weighted by value norm
            (``attend(norms=True)``; Kobayashi et al. 2020): ``alpha_ij * ||f_h(x_j)||`` with
            ``f_h(x) = (x W_V^h + b_V^h) W_O^h``; None when not asked for.
        decoder_special: special-token flags of ``decoder_tokens``.
        kind: which attention ``attention`` holds when the result is one kind of an
            encoder-decoder's (``of_kind``): ``encoder``, ``decoder`` or ``cross``; None for
            a result as computed.
        query_tokens: the queries' tokens where they are not ``tokens`` (cross-attention: the
            decoder's, while ``tokens`` are the encoder's, the keys); ``attention`` is then
            ``[layers, heads, len(query_tokens), len(tokens)]``. None: the queries are
            ``tokens``.
        layer_ids: the model's layer each of ``attention``'s layers is, when only some were
            selected (``attend(layers=...)``); None: every layer, in order.
        head_ids: the model's head each of ``attention``'s heads is (the same heads in every
            selected layer), when only some were selected; None: every head.
        attention_dtype: the dtype the weights were stored in (``mhsa.engine.runs.selection``:
            ``float32``, ``float16``, or ``bfloat16`` held in a float16 array).
        q, k: float32 ``[layers, heads, n, d_head]``, each head's query and key vectors as its
            scores take them (``attend(qk=True)``; ``mhsa.engine.runs.query_keys``): ``attention``
            is ``softmax(q k^T * qk_scale)`` over the keys the mask leaves; None when not
            asked for (the neuron view needs them).
        qk_scale: the scores' scale (``1 / sqrt(d_head)`` unless the model says otherwise).
    """

    text: str
    tokens: list[str]
    attention: np.ndarray
    offsets: list[tuple[int, int]]
    special: list[bool]
    punctuation: list[bool]
    word_ids: list[int]
    model: str
    engine: str
    device: str
    num_parameters: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    causal: bool = False
    truncated_tokens: int = 0
    max_abs_diff: float | None = None
    layer_max_abs_diff: list[float] | None = None
    hidden_max_abs_diff: float | None = None
    seed: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    prompt_chars: int | None = None
    word_level: bool = False
    text_pair: str | None = None
    decoder_tokens: list[str] | None = None
    decoder_attention: np.ndarray | None = None
    cross_attention: np.ndarray | None = None
    norms: np.ndarray | None = None
    decoder_special: list[bool] | None = None
    kind: str | None = None
    query_tokens: list[str] | None = None
    decoder_layer_max_abs_diff: list[float] | None = None
    cross_layer_max_abs_diff: list[float] | None = None
    encoder_hidden_max_abs_diff: float | None = None
    layer_ids: list[int] | None = None
    head_ids: list[int] | None = None
    attention_dtype: str = "float32"
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    qk_scale: float | None = None

    def __post_init__(self) -> None:
        a, m, n = self.attention, self.num_queries, len(self.tokens)
        if a.ndim != 4 or a.shape[2] != m or a.shape[3] != n:
            raise ValueError(f"attention must be [layers, heads, {m}, {n}], got {list(a.shape)}")
        for ids, size, what in (
            (self.layer_ids, a.shape[0], "layer"),
            (self.head_ids, a.shape[1], "head"),
        ):
            if ids is not None and len(ids) != size:
                raise ValueError(f"{what}_ids must name {size} {what}s, got {len(ids)}")
        if self.norms is not None and self.norms.shape != a.shape:
            raise ValueError(
                f"norms must have attention's shape {list(a.shape)}, got {list(self.norms.shape)}"
            )
        for name, rows in (("q", m), ("k", n)):
            vectors = getattr(self, name)
            if vectors is not None and (
                vectors.ndim != 4 or vectors.shape[:3] != (*a.shape[:2], rows)
            ):
                raise ValueError(
                    f"{name} must be [layers, heads, {rows}, d_head] beside attention "
                    f"{list(a.shape)}, got {list(vectors.shape)}"
                )

    @property
    def num_layers(self) -> int:
        return int(self.attention.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.attention.shape[1])

    @property
    def num_tokens(self) -> int:
        """The keys' tokens (all tokens, but for cross-attention)."""
        return len(self.tokens)

    @property
    def queries(self) -> list[str]:
        """The queries' tokens: ``query_tokens`` for cross-attention, else ``tokens``."""
        return self.tokens if self.query_tokens is None else self.query_tokens

    @property
    def num_queries(self) -> int:
        return len(self.queries)

    @property
    def is_encoder_decoder(self) -> bool:
        """The result holds an encoder-decoder model's three attentions (``of_kind``)."""
        return self.cross_attention is not None and self.decoder_tokens is not None

    def of_kind(self, kind: str) -> AttentionResult:
        """One attention of an encoder-decoder model as a result every view reads.

        Args:
            kind: ``encoder`` (``self`` itself), ``decoder`` (the decoder's self-attention over
                ``decoder_tokens``) or ``cross`` (queries: ``decoder_tokens``; keys:
                ``tokens``, the encoder's; ``attention`` ``[layers, heads, m, n]``).

        Returns:
            The result with ``attention`` the chosen array, ``kind`` set and the other kinds'
            fields cleared (value norms are the encoder's: kept for ``encoder`` only).

        Raises:
            InputError: an unknown kind, or decoder/cross attention of a result without it
                (not an encoder-decoder, or merged into whole words).
        """
        if kind not in ATTENTION_KINDS:
            raise InputError(f"Unknown attention {kind!r}: one of {', '.join(ATTENTION_KINDS)}.")
        if self.kind is not None:
            if kind == self.kind:
                return self
            raise InputError(f"This result holds {self.kind} attention only.")
        if kind == "encoder":
            return self
        if not self.is_encoder_decoder:
            raise InputError(
                f"No {kind} attention here: it comes from encoder-decoder models (T5, BART, "
                "Marian) over tokens (whole words keep the encoder's alone)."
            )
        cleared = {"decoder_attention": None, "cross_attention": None, "norms": None}
        cleared |= {"q": None, "k": None, "qk_scale": None}
        if kind == "cross":
            return dataclasses.replace(
                self,
                attention=self.cross_attention,
                query_tokens=list(self.decoder_tokens),
                kind=kind,
                **cleared,
            )
        dec = list(self.decoder_tokens)
        special = list(self.decoder_special or [False] * len(dec))
        return dataclasses.replace(
            self,
            text=self.text_pair if self.text_pair is not None else self.text,
            tokens=dec,
            attention=self.decoder_attention,
            offsets=[(0, 0)] * len(dec),
            special=special,
            punctuation=[is_punctuation(t) and not sp for t, sp in zip(dec, special, strict=True)],
            word_ids=[-1 if sp else i for i, sp in enumerate(special)],
            causal=True,
            prompt_chars=None,
            kind=kind,
            **cleared,
        )

    @property
    def generated(self) -> list[bool]:
        """Which tokens the model generated (all False unless ``prompt_chars`` is set)."""
        if self.prompt_chars is None:
            return [False] * self.num_tokens
        # the prompt's special tokens sit at (0, 0); generated ones where they were written
        return [
            start >= self.prompt_chars and (start > 0 or not sp)
            for (start, _), sp in zip(self.offsets, self.special, strict=True)
        ]

    @property
    def generated_from(self) -> int | None:
        """The first generated token, or None."""
        return next((i for i, g in enumerate(self.generated) if g), None)

    @property
    def layers(self) -> list[int]:
        """The model's layer each of ``attention``'s layers is (``layer_ids``, else 0..L-1)."""
        return list(range(self.num_layers)) if self.layer_ids is None else list(self.layer_ids)

    @property
    def heads(self) -> list[int]:
        """The model's head each of ``attention``'s heads is (``head_ids``, else 0..H-1)."""
        return list(range(self.num_heads)) if self.head_ids is None else list(self.head_ids)

    @property
    def is_partial(self) -> bool:
        """Only some layers or heads were materialised (``attend(layers=..., heads=...)``)."""
        return self.layer_ids is not None or self.head_ids is not None

    def head_labels(self) -> list[str]:
        """``L{layer}H{head}`` for every head held, layer-major, with the model's own layer
        and head numbers (a partial result's too)."""
        return [head_label(li, h) for li in self.layers for h in self.heads]

    def label(self, layer: int, head: int) -> str:
        """The label of ``attention[layer, head]`` (positions in the array): the model's own
        numbers."""
        return head_label(self.layers[layer], self.heads[head])

    def index_of(self, layer: int, head: int) -> tuple[int, int]:
        """Where the model's ``layer`` and ``head`` sit in ``attention``.

        Raises:
            InputError: that layer or head was not materialised (the message says which were).
        """
        layers, heads = self.layers, self.heads
        if layer not in layers or head not in heads:
            raise InputError(
                f"L{layer}H{head} was not materialised: this result holds {self.materialised}."
            )
        return layers.index(layer), heads.index(head)

    @property
    def materialised(self) -> str:
        """What ``attention`` holds, for people: ``"layers 2 x heads 0-7 of 4 x 32, float16,
        12.0 MB"``."""
        facts = self.facts or {}
        of = ""
        if facts.get("layers") and facts.get("heads"):
            of = f" of {facts['layers']} x {facts['heads']}"
        size = self.attention.nbytes / 2**20
        return (
            f"layers {_ranges(self.layers)} x heads {_ranges(self.heads)}{of}, "
            f"{self.attention_dtype}, {size:,.1f} MB"
        )

    def require_layers_from_zero(self, what: str) -> None:
        """Refuse an analysis that composes layers from the input up (rollout) on a result
        whose layers are not 0, 1, ... with every head.

        Raises:
            InputError: naming ``what`` and what it needs.
        """
        if self.layers != list(range(self.num_layers)) or self.head_ids is not None:
            raise InputError(
                f"{what} needs consecutive layers from 0 with every head; this result holds "
                f"{self.materialised}. Select layers 0-{max(self.layers)} and all heads."
            )

    # --- word level ---------------------------------------------------------------------------
    def to_words(self) -> AttentionResult:
        """Merge sub-word tokens into words (Clark et al. 2019).

        A word is what the tokenizer's pre-tokenizer keeps together (``word_ids``): text between
        whitespace, with every punctuation character a word of its own. Clark et al. used their
        input's own word list instead.

        Attention *to* a word is the sum over its pieces; attention *from* a word is the mean over
        its pieces, so rows still sum to 1. Special tokens stay units of their own. Value norms
        (``norms``) merge the same way.
        """
        if self.word_level:
            return self
        if self.query_tokens is not None:
            raise InputError("Whole words merge self-attention, not cross-attention.")
        member = word_groups(tuple(self.word_ids))  # (W, n)
        mean_rows = member / member.sum(axis=1, keepdims=True)  # (W, n)

        def merged(array: np.ndarray) -> np.ndarray:
            return np.einsum("wq,lhqk,vk->lhwv", mean_rows, array, member, optimize=True)

        words = merged(self.attention)
        strings, offsets, special, word_ids = [], [], [], []
        for u, row in enumerate(member):
            idx = np.flatnonzero(row)
            first, last = int(idx[0]), int(idx[-1])
            span = (self.offsets[first][0], self.offsets[last][1])
            if self.special[first]:
                strings.append(self.tokens[first])
            elif span[1] > span[0]:
                strings.append(self.text[span[0] : span[1]])
            else:
                strings.append("".join(self.tokens[i].replace("##", "") for i in idx))
            offsets.append(span)
            special.append(self.special[first])
            word_ids.append(-1 if self.special[first] else u)
        return dataclasses.replace(
            self,
            tokens=strings,
            attention=words.astype(self.attention.dtype),  # float16 stays 16 bits
            offsets=offsets,
            special=special,
            punctuation=[
                is_punctuation(s) and not sp for s, sp in zip(strings, special, strict=True)
            ],
            word_ids=word_ids,
            word_level=True,
            norms=None if self.norms is None else merged(self.norms).astype(np.float32),
            decoder_tokens=None,
            decoder_attention=None,
            cross_attention=None,
            decoder_special=None,
            q=None,  # vectors belong to tokens, not words
            k=None,
            qk_scale=None,
        )

    # --- notebook views -----------------------------------------------------------------------
    def show(self, view: str = "heads", **options: Any) -> NotebookView:
        """The heads in a notebook (``mhsa.plots.notebook.result_html``): every head as a small
        map, the chosen one enlarged; hover a token to see where it attends.

        Args:
            view: ``"heads"`` (the chosen head as a map), ``"line"`` (as lines) or
                ``"neuron"`` (BertViz's neuron view: a query's vector, each key's, their
                products, scores and weights; needs ``attend(..., qk=True)``).
            **options: ``layer``, ``head`` (positions in ``attention``), ``theme``
                (``"auto"``, ``"light"``, ``"dark"``).
        """
        return NotebookView(html_view("attention")(self, view, **options))

    def _repr_html_(self) -> str:
        """The heads view where a notebook cell ends with a result; a result too large for one
        says why in one line (and ``show`` with ``layer=``/``head=`` choices still raises)."""
        try:
            return self.show().html
        except InputError as e:
            return f"<p>{html.escape(str(e))}</p>"

    def to_html(self, path: str | Path, view: str = "heads", **options: Any) -> Path:
        """``show``'s view as a whole HTML document at ``path``, self-contained (it opens
        offline in any browser). Returns the path."""
        body = self.show(view, **options).html
        title = html.escape(f"{self.model} attention")
        out = Path(path)
        out.write_text(
            f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>'
            f'<body style="margin:16px">{body}</body></html>',
            encoding="utf-8",
        )
        return out

    # --- persistence --------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """Everything but the arrays, as JSON-ready values."""
        meta = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ARRAY_FIELDS
        }
        meta["offsets"] = [list(o) for o in self.offsets]
        return {"format": _FORMAT, "version": _FORMAT_VERSION, **meta}

    def save(self, path: str | Path | BinaryIO) -> str | Path | BinaryIO:
        """Write a compressed ``.npz`` (to a path or a binary file): the arrays plus a JSON
        header (no pickle)."""
        arrays = {k: getattr(self, k) for k in ARRAY_FIELDS if getattr(self, k) is not None}
        header = np.frombuffer(json.dumps(self.header()).encode(), dtype=np.uint8)
        if isinstance(path, str | Path):
            with Path(path).open("wb") as fh:  # the exact name (numpy would append ".npz")
                np.savez_compressed(fh, header=header, **arrays)
        else:
            np.savez_compressed(path, header=header, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> AttentionResult:
        """Read a file written by ``save``."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(data["header"].tobytes().decode())
                arrays = {k: data[k] for k in ARRAY_FIELDS if k in data.files}
        except (OSError, ValueError, KeyError) as e:
            raise InputError(f"{path} is not an MHSA Explorer result file: {e}") from e
        if meta.pop("format", None) != _FORMAT:
            raise InputError(f"{path} is not an MHSA Explorer result file")
        meta.pop("version", None)
        meta["offsets"] = [tuple(o) for o in meta["offsets"]]
        return cls(**meta, **arrays)


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    start = prev = None
    for v in [*values, None]:
        if start is not None and (v is None or v != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if v is not None and start is None:
            start = v
        prev = v
    return ",".join(parts)
