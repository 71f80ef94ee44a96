"""Head roles: what a head does, named with the field's definitions.

- Head detection: TransformerLens's ``detect_head`` scores (previous-token, duplicate-token and
  induction heads, or a pattern of one's own), and its demo's induction score on repeated random
  tokens.
- Attention sinks (Gu et al. 2025): key positions a head gives most of its attention to.
- Head composition (Elhage et al. 2021, as TransformerLens computes it): how strongly a head's
  output feeds a later head's queries, keys or values, from the weights alone
  (``mhsa.analysis.composition``, re-exported here).

The detection definitions follow ``transformer_lens/head_detector.py`` (TransformerLensOrg/
TransformerLens): ``get_previous_token_head_detection_pattern``,
``get_duplicate_token_head_detection_pattern``, ``get_induction_head_detection_pattern`` and
``compute_head_attention_similarity_score``. The composition scores follow
``HookedTransformer.all_composition_scores`` and ``composition_scores`` in
``transformer_lens/utilities/matrix.py`` (``FactoredMatrix`` in ``transformer_lens/
FactoredMatrix.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from mhsa.analysis.composition import COMPOSITION_KINDS, head_composition, strongest_inputs
from mhsa.analysis.repeats import REPEAT_COUNT, random_repeats, repeat_length
from mhsa.engine.encoding import check_text, encode, encode_many
from mhsa.engine.extract import engine_spec
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.batches import Corpus, attend_batched, attend_one_by_one, batch_attention
from mhsa.errors import InputError
from mhsa.heads import head_label

__all__ = [
    "COMPOSITION_KINDS",
    "DETECTION_PATTERNS",
    "ERROR_MEASURES",
    "SINK_MIN_QUERIES",
    "SINK_THRESHOLD",
    "AttentionSinks",
    "attention_sinks",
    "detect_heads",
    "detection_pattern",
    "detection_scores",
    "head_composition",
    "induction_scores",
    "sink_value_norms",
    "strongest_inputs",
]

#: the named detection patterns (TransformerLens's head names, written for people)
DETECTION_PATTERNS = ("previous token", "duplicate token", "induction")
#: TransformerLens's spellings of the same names
_ALIASES = {
    "previous_token_head": "previous token",
    "duplicate_token_head": "duplicate token",
    "induction_head": "induction",
}
ERROR_MEASURES = ("mul", "abs")
#: Gu et al. (2025): a head sinks on a position that receives more than this, on average
SINK_THRESHOLD = 0.3
#: a causal model's key is measured only where at least this many queries can attend it
SINK_MIN_QUERIES = 4


# --- detection patterns -----------------------------------------------------------------------


def _pattern_name(name: str) -> str:
    key = _ALIASES.get(name, name)
    if key not in DETECTION_PATTERNS:
        raise InputError(
            f"Unknown detection pattern {name!r}: choose one of {', '.join(DETECTION_PATTERNS)}, "
            "or pass a square array."
        )
    return key


def detection_pattern(name: str, token_ids: Sequence[int]) -> np.ndarray:
    """The ``[n, n]`` detection pattern called ``name`` for a text's token ids (special tokens
    included), as TransformerLens builds it (``transformer_lens/head_detector.py``,
    ``get_{previous_token,duplicate_token,induction}_head_detection_pattern``):

    - ``"previous token"``: 1 at ``(i, i - 1)``;
    - ``"duplicate token"``: 1 at ``(i, j)``, ``j < i``, where token j is the same as token i;
    - ``"induction"``: the duplicate pattern moved one key to the right: 1 at ``(i, j)``,
      ``j <= i``, where token ``j - 1`` is the same as token i.

    Raises:
        InputError: an unknown name.
    """
    kind = _pattern_name(name)
    ids = np.asarray(token_ids)
    n = len(ids)
    if kind == "previous token":
        return np.eye(n, k=-1)
    duplicate = ids[:, None] == ids[None, :]
    np.fill_diagonal(duplicate, False)  # a token is always a duplicate of itself
    duplicate = np.tril(duplicate).astype(np.float64)
    if kind == "duplicate token":
        return duplicate
    induction = np.zeros_like(duplicate)
    induction[:, 1:] = duplicate[:, :-1]  # TransformerLens's roll by one, first column zeroed
    return np.tril(induction)


def _check_measure(error_measure: str) -> None:
    if error_measure not in ERROR_MEASURES:
        raise InputError(
            f"Unknown error_measure {error_measure!r}: choose one of {', '.join(ERROR_MEASURES)}."
        )


def _check_pattern(pattern: np.ndarray, n: int, error_measure: str, *, causal: bool) -> np.ndarray:
    """``pattern`` as float64 when it is an ``[n, n]`` array of finite numbers, lower
    triangular when the attention is ``causal``."""
    pattern = np.asarray(pattern, dtype=np.float64)
    if pattern.shape != (n, n):
        raise InputError(
            f"The detection pattern must be a square array with one row and one column per "
            f"token: the text has {n} tokens, so [{n}, {n}], got {list(pattern.shape)}."
        )
    if not np.isfinite(pattern).all():
        raise InputError("The detection pattern holds NaN or infinite values.")
    if causal and np.triu(pattern, 1).any():
        raise InputError(
            "The detection pattern must be lower triangular for this causal model: it has "
            "non-zero values above the diagonal, on keys after their query, and a query of a "
            "causal model never attends to later tokens. Use a bidirectional model "
            "(BERT-like) to score attention to later tokens."
        )
    if error_measure == "mul" and not np.isin(pattern, (0.0, 1.0)).all():
        warnings.warn(
            "A detection pattern with values other than 0 or 1 under error_measure 'mul' "
            "(TransformerLens warns alike): the score is then no share of attention.",
            stacklevel=3,
        )
    return pattern


# --- scores -----------------------------------------------------------------------------------


def detection_scores(
    attention: np.ndarray,
    pattern: np.ndarray,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: str = "mul",
) -> np.ndarray:
    """Every head's TransformerLens detection score for one text: ``[layers, heads]``.

    ``compute_head_attention_similarity_score`` in ``transformer_lens/head_detector.py``:

    - ``"mul"``: attention on the pattern / total attention, after zeroing the attention to
      the first token (``exclude_bos``; column 0, whatever token it is) and to the query itself
      (``exclude_current_token``; the diagonal);
    - ``"abs"``: ``1 - round(mean |attention - pattern| * n, 3)``, the same columns zeroed in
      the difference; causal attention only (TransformerLens asserts the difference is lower
      triangular).

    TransformerLens has causal models only and asserts the pattern is lower triangular; that
    holds here for causal attention (none above the diagonal: a key after its query is never
    attended). For a bidirectional model (BERT-like, attention above the diagonal) any square
    pattern is accepted and ``"mul"`` applies to the full matrix, which extends TransformerLens's
    definition to bidirectional models (``"abs"`` stays causal only).

    ``attention`` is read, never written (TransformerLens zeroes the caller's tensor in place).

    Args:
        attention: ``[layers, heads, n, n]`` weights of one text.
        pattern: ``[n, n]`` detection pattern (``detection_pattern``), lower triangular for a
            causal model.
        exclude_bos: leave out the attention to the first token.
        exclude_current_token: leave out each query's attention to itself.
        error_measure: ``"mul"`` or ``"abs"``.

    Raises:
        InputError: fewer than two tokens, a pattern of the wrong shape, one not lower
            triangular for causal attention, an unknown measure, or ``"abs"`` on attention to
            later tokens.
    """
    _check_measure(error_measure)
    n = attention.shape[-1]
    if n < 2:
        raise InputError("Head detection needs a text of at least two tokens; this has one.")
    causal = not np.triu(attention, 1).any()  # a bidirectional head attends to later keys
    pattern = _check_pattern(pattern, n, error_measure, causal=causal)
    keep = np.ones((n, n))  # 0 where TransformerLens zeroes
    if exclude_bos:
        keep[:, 0] = 0.0
    if exclude_current_token:
        np.fill_diagonal(keep, 0.0)
    if error_measure == "mul":
        on_pattern = np.einsum("lhqk,qk->lh", attention, keep * pattern)  # (L, H)
        return on_pattern / np.einsum("lhqk,qk->lh", attention, keep)
    if np.triu(attention, 1).any():
        raise InputError(
            "error_measure 'abs' compares with a lower-triangular pattern and needs a causal "
            "(decoder) model; this model attends to later tokens: use 'mul'."
        )
    total = (np.abs(attention - pattern) * keep).sum(axis=(-2, -1))  # (L, H)
    mean_times_n = total / n  # TransformerLens: abs_diff.mean() * size
    return np.vectorize(lambda x: 1 - round(float(x), 3), otypes=[np.float64])(mean_times_n)


def _score_frame(scores: np.ndarray, result: AttentionResult | None = None) -> pd.DataFrame:
    """Scores ``[layers, heads]`` indexed ``L{l}H{h}`` (``result``'s own labels: a partial
    result's are the model's layers and heads)."""
    layers, heads = scores.shape
    labels = (
        result.head_labels()
        if result is not None
        else [head_label(layer, head) for layer in range(layers) for head in range(heads)]
    )
    return pd.DataFrame({"score": scores.reshape(-1)}, index=pd.Index(labels, name="head"))


def _texts(texts: str | Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, Sequence) or not texts:
        raise InputError("Give at least one text (or texts=None for the random-token test).")
    return [check_text(text, f"text {i}") for i, text in enumerate(texts, start=1)]


def _results(
    lm: LoadedModel, texts: list[str], engine: str, seed: int
) -> list[tuple[list[int], AttentionResult]]:
    """Each text's token ids (as the tokenizer gives them, special tokens included) and its
    attention, in the texts' order."""
    with lm.lock:
        encoded = encode_many(lm, texts)
    for i, item in enumerate(encoded, start=1):
        if isinstance(item, InputError):
            raise InputError(f"Text {i}: {item}")
    ids = [e.inputs["input_ids"][0].tolist() for e in encoded]  # type: ignore[union-attr]
    for i, row in enumerate(ids, start=1):
        if len(row) < 2:
            raise InputError(
                f"Text {i} ({texts[i - 1]!r}) gives {len(row)} token for this model; head "
                "detection needs at least two: write a longer text."
            )
    entries = Corpus.of(texts).entries
    run = attend_one_by_one if lm.is_encoder_decoder else attend_batched
    results = dict(run(entries, lm, engine=engine, seed=seed))
    return [(row, results[i]) for i, row in enumerate(ids)]


def detect_heads(
    texts: str | Sequence[str] | None,
    pattern: str | np.ndarray = "induction",
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    engine: str = "transformers",
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: str = "mul",
    seed: int = 0,
    repeat_length: int | None = None,
    result: AttentionResult | None = None,
) -> pd.DataFrame:
    """Which heads are previous-token, duplicate-token or induction heads (or match a pattern
    of one's own), scored exactly as TransformerLens's ``detect_head`` scores them
    (``transformer_lens/head_detector.py``; see ``detection_pattern`` and
    ``detection_scores``).

    Each text's pattern is built from its token ids as the model's tokenizer gives them,
    special tokens ([CLS], [SEP], BOS) included; a head's score is the mean over the texts of
    its score on each. (TransformerLens, given several texts and a named pattern, scores each
    with the default options whatever ``exclude_bos``, ``exclude_current_token`` and
    ``error_measure`` say; here the options apply to every text.)

    With ``texts=None``: the induction test of TransformerLens's demo: ten sequences of random
    token ids (drawn from the model's vocabulary without its special tokens, from ``seed``),
    each repeated once, no BOS; a head's score is the mean of its attention along the diagonal
    at offset ``1 - length`` (from each token of the repeat to the token after its earlier
    occurrence). See ``induction_scores``.

    With ``result``: the text's attention already computed (``attend(text, ...)``, of any
    engine), scored without running the model again, as TransformerLens's
    ``detect_head(..., cache=...)`` reads a cache; the model's tokenizer still gives the token
    ids the patterns are built from.

    Args:
        texts: the texts, one text, or None (the random-token induction test).
        pattern: ``"previous token"``, ``"duplicate token"``, ``"induction"``, or an
            ``[n, n]`` array for one text of n tokens (lower triangular for a causal model; any
            square pattern for a bidirectional one, see ``detection_scores``).
        model: a model name or folder, or a loaded model.
        engine: ``"transformers"``, ``"mhsa"`` or ``"mhsa-random"`` (``mhsa.engine.ENGINE_SPECS``).
        exclude_bos: leave out the attention to the first token.
        exclude_current_token: leave out each token's attention to itself.
        error_measure: ``"mul"`` (share of attention on the pattern) or ``"abs"`` (1 minus the
            mean absolute difference times n; causal models only).
        seed: the random tokens' seed (``texts=None``), and the ``mhsa-random`` weights'.
        repeat_length: ``texts=None``: length of each random half; 50 (the demo's) or, for
            models of fewer positions, half of them.
        result: one text's token-level attention, already computed (``texts`` is that text);
            ``engine`` and ``seed`` are then not used. ``texts=None`` with a result (one from
            ``from_attention`` without its text, say): the patterns compare the result's token
            strings, which a tokenizer maps to ids one to one, and no model is loaded.

    Returns:
        One row per head, indexed ``L{layer}H{head}``, with the column ``score``.

    Raises:
        InputError: an unknown pattern or measure, a pattern of the wrong shape, ``"abs"`` for
            a model that attends to later tokens, a text of fewer than two tokens; with
            ``result``: several texts or none, or a result of other tokens than the text's
            (whole words, cross attention, another text).
    """
    if result is not None:
        return _detect_in(
            result,
            texts,
            pattern,
            model,
            error_measure,
            exclude_bos=exclude_bos,
            exclude_current_token=exclude_current_token,
        )
    if texts is None:
        if not (isinstance(pattern, str) and _ALIASES.get(pattern, pattern) == "induction"):
            raise InputError(
                "texts=None runs the random-token induction test: use pattern='induction', "
                "or give texts."
            )
        if exclude_bos or exclude_current_token or error_measure != "mul":
            raise InputError(
                "The random-token induction test has no options: it averages the induction "
                "diagonal. Give texts to use exclude_bos, exclude_current_token or 'abs'."
            )
        scores = induction_scores(model, engine=engine, seed=seed, length=repeat_length)
        return _score_frame(scores)
    _check_measure(error_measure)  # the arguments are checked before any model runs
    name = _pattern_name(pattern) if isinstance(pattern, str) else None
    texts = _texts(texts)
    if name is None and len(texts) != 1:
        raise InputError("A detection pattern given as an array is for one text: give one text.")
    items = _results(resolve_model(model), texts, engine, seed)
    if name is None:
        patterns = [np.asarray(pattern)]
    else:
        patterns = [detection_pattern(name, ids) for ids, _ in items]
    options = {
        "exclude_bos": exclude_bos,
        "exclude_current_token": exclude_current_token,
        "error_measure": error_measure,
    }
    scores = [
        detection_scores(result.attention, p, **options)
        for (_, result), p in zip(items, patterns, strict=True)
    ]
    return _score_frame(np.mean(scores, axis=0))


def _detect_in(
    result: AttentionResult,
    text: str | Sequence[str] | None,
    pattern: str | np.ndarray,
    model: str | LoadedModel,
    error_measure: str,
    **exclusions: bool,
) -> pd.DataFrame:
    """``detect_heads`` of one text whose attention ``result`` is already computed; with
    ``text=None``, the token ids are the result's token strings numbered (a tokenizer maps
    ids to strings one to one, so the patterns, which compare ids, are the same)."""
    _check_measure(error_measure)
    if text is not None and not isinstance(text, str):
        raise InputError("result= is one text's attention: give that text (a string) as texts.")
    if result.word_level or result.kind == "cross":
        raise InputError(
            "Head detection is defined on a sequence's own tokens: give a token-level result "
            "of self-attention (not to_words(), not cross attention)."
        )
    if text is None:
        numbers: dict[str, int] = {}
        ids = [numbers.setdefault(t, len(numbers)) for t in result.tokens]
    else:
        ids = _token_ids(result, text, resolve_model(model))
    if len(ids) < 2:
        raise InputError(f"The text gives {len(ids)} token; head detection needs two or more.")
    p = detection_pattern(pattern, ids) if isinstance(pattern, str) else np.asarray(pattern)
    scores = detection_scores(result.attention, p, error_measure=error_measure, **exclusions)
    return _score_frame(scores, result)


def _token_ids(result: AttentionResult, text: str, lm: LoadedModel) -> list[int]:
    """``text``'s token ids for ``lm``, checked to be the tokens ``result`` holds."""
    cut = result.num_tokens if result.truncated_tokens else None  # as attend cut the text
    with lm.lock:
        encoded = encode(lm, check_text(text, "the text"), None, cut)
    if list(encoded.tokens.strings) != list(result.tokens):
        raise InputError(
            "result= holds the attention of other tokens than this text's for this model: "
            "give the text the result was computed from."
        )
    return encoded.inputs["input_ids"][0].tolist()


def induction_scores(
    model: str | LoadedModel = DEFAULT_MODEL,
    *,
    engine: str = "transformers",
    seed: int = 0,
    length: int | None = None,
    count: int = REPEAT_COUNT,
) -> np.ndarray:
    """The induction score of TransformerLens's demo, ``[layers, heads]``: ``count`` sequences
    of ``length`` random token ids (the vocabulary without its special tokens, drawn from
    ``seed``), each followed by itself, no BOS; per head the mean, over the sequences and the
    positions, of ``pattern.diagonal(offset=1 - length)``: the attention from each token to the
    token after its earlier occurrence. (The trainer's ``mhsa.training.head_scores`` averages
    over the repeated positions of a task's own sequences instead.)

    Raises:
        InputError: the length does not fit the model (each sequence is ``2 * length`` tokens).
    """
    lm = resolve_model(model)
    spec = engine_spec(engine)
    length = repeat_length(lm, length, count)
    ids = random_repeats(lm, length, count, seed).to(lm.device)
    with lm.lock, torch.inference_mode():
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        layers, _ = batch_attention(lm, spec, inputs, seed)  # L x (B, H, T, T)
        stripes = [a.diagonal(offset=1 - length, dim1=-2, dim2=-1) for a in layers]
        return torch.stack([s.float().mean(dim=(0, 2)) for s in stripes]).cpu().numpy()


# --- attention sinks --------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionSinks:
    """Where heads sink their attention (Gu et al. 2025), for one text.

    Attributes:
        table: one row per head and key position: ``head`` (``L{l}H{h}``), ``layer``,
            ``head_index``, ``position``, ``token``, ``queries`` (how many queries can attend
            the position), ``received`` (the mean attention the position receives from them;
            NaN where too few can attend it to say: ``attention_sinks``) and ``sink``
            (``received`` above the threshold).
        share: the share of heads that sink on at least one position.
        first_share: the share of heads that sink on the first token (Gu et al.'s sink rate).
        threshold: the threshold used.
        causal: the attention is causal (each key measured over the queries at or after it).
    """

    table: pd.DataFrame
    share: float
    first_share: float
    threshold: float
    causal: bool = False


def attention_sinks(result: AttentionResult, threshold: float = SINK_THRESHOLD) -> AttentionSinks:
    """Per head and key position j, the mean attention j receives from the queries that can
    attend it; a head sinks on j when that exceeds ``threshold`` (0.3, Gu et al.'s epsilon).

    Gu et al. 2025 ("When Attention Sink Emerges in Language Models") measure the first token
    of causal models, ``alpha_1 = sum_i a[i, 1] / T``; at a later key j of a causal model only
    the ``n - j`` queries at or after it can attend it, so its mean is
    ``sum_{i >= j} a[i, j] / (n - j)``, measured only where at least ``SINK_MIN_QUERIES`` queries
    can (the last key's mean is one query's weight on itself: a "sink" of nothing but its
    place). In an encoder every query attends every key: the mean is over all ``n`` queries.

    Raises:
        InputError: a threshold outside [0, 1).
    """
    if not 0.0 <= threshold < 1.0:
        raise InputError(f"The sink threshold must be from 0 to below 1, got {threshold}.")
    a = result.attention  # (L, H, n, n), read only
    layers, heads, n, _ = a.shape
    if result.causal:
        queries = np.arange(n, 0, -1)  # key j: the queries i >= j
        received = np.tril(a).sum(axis=-2, dtype=np.float64) / queries  # (L, H, n)
        received[..., queries < min(SINK_MIN_QUERIES, n)] = np.nan
    else:
        queries = np.full(n, n)
        received = a.sum(axis=-2, dtype=np.float64) / n
    sink = np.nan_to_num(received, nan=0.0) > threshold  # (L, H, n)
    layer, head, position = np.meshgrid(
        np.arange(layers), np.arange(heads), np.arange(n), indexing="ij"
    )
    # the model's own layer and head numbers (a partial result holds some of them)
    layer_id = np.asarray(result.layers, dtype=int)[layer.ravel()]
    head_id = np.asarray(result.heads, dtype=int)[head.ravel()]
    table = pd.DataFrame(
        {
            "head": [head_label(li, h) for li, h in zip(layer_id, head_id, strict=True)],
            "layer": layer_id,
            "head_index": head_id,
            "position": position.ravel(),
            "token": np.asarray(result.tokens, dtype=object)[position.ravel()],
            "queries": np.broadcast_to(queries, received.shape).ravel(),
            "received": received.ravel(),
            "sink": sink.ravel(),
        }
    )
    return AttentionSinks(
        table=table,
        share=float(sink.any(axis=-1).mean()),
        first_share=float(sink[..., 0].mean()),
        threshold=threshold,
        causal=result.causal,
    )


def sink_value_norms(result: AttentionResult, threshold: float = SINK_THRESHOLD) -> pd.DataFrame:
    """What each attention sink carries: per sink (head, position) of ``attention_sinks``, the
    norm ``||f_h(x_j)||`` of the value vector head h reads at the sink j after its slice of the
    output projection (Kobayashi et al. 2020; ``mhsa.engine.runs.norms``), beside the head's median
    over
    all positions. A sink whose value norm is far below the median draws attention while
    adding little to the output (Gu et al. 2025 and Kobayashi et al. observe this on the first
    token).

    ``result.norms`` holds ``alpha_ij * ||f_h(x_j)||``, so the norm at key j is
    ``sum_i norms[i, j] / sum_i alpha_ij`` (exact, over the queries that attend to j; NaN
    where none does). On a whole-word result a word's norm is so its pieces' norms, averaged
    with the attention they receive.

    Args:
        result: a result computed with value norms (``attend(..., norms=True)``).
        threshold: the sink threshold (``attention_sinks``).

    Returns:
        One row per sink, heads in order then positions: ``head`` (``L{l}H{h}``),
        ``position``, ``token``, ``received`` (mean attention received, as in
        ``attention_sinks``), ``value_norm``, ``median_value_norm`` (the head's, over the
        positions) and ``ratio`` (``value_norm / median_value_norm``).

    Raises:
        InputError: a result without value norms, or a threshold outside [0, 1).
    """
    if result.norms is None:
        raise InputError(
            "The sinks' value norms need a result computed with value norms: call "
            "attend(..., norms=True)."
        )
    sinks = attention_sinks(result, threshold)
    total = result.attention.sum(axis=-2, dtype=np.float64)  # (L, H, n): attention each key gets
    weighted = result.norms.sum(axis=-2, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        value_norm = np.where(total > 0, weighted / total, np.nan)  # (L, H, n)
    median = np.nanmedian(value_norm, axis=-1, keepdims=True)  # (L, H, 1)
    median = np.broadcast_to(median, value_norm.shape)
    table = sinks.table.assign(value_norm=value_norm.ravel(), median_value_norm=median.ravel())
    table = table[table["sink"]].assign(ratio=lambda t: t["value_norm"] / t["median_value_norm"])
    columns = ["head", "position", "token", "received", "value_norm", "median_value_norm"]
    return table[[*columns, "ratio"]].reset_index(drop=True)
