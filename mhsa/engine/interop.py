"""Attention computed elsewhere as an ``AttentionResult``: ``from_attention``.

The field's libraries hand attention over in a few shapes: transformers' ``outputs.attentions``
(a tuple of ``[batch, heads, q, k]``, one per layer, with ``output_attentions=True`` and eager
attention), a stacked ``[layers, heads, q, k]`` tensor or array, TransformerLens's
``ActivationCache`` (``cache["pattern", layer]``: the ``blocks.{layer}.attn.hook_pattern`` hook,
``[batch, heads, q, k]``) and nnsight's saved values (a list of tensors). Every analysis that
reads attention alone (statistics, similarity, roles, rollout, detection, the notebook views)
then runs on it. Nothing here imports TransformerLens or nnsight: they are read by duck typing.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from mhsa.engine.encoding import check_text, encode
from mhsa.engine.models.loading import LoadedModel, resolve_model
from mhsa.engine.result import AttentionResult
from mhsa.engine.tokens import is_punctuation
from mhsa.errors import InputError

__all__ = [
    "ATTENTION_FILE_TYPES",
    "IMPORTED_ENGINE",
    "KNOWN_SPECIAL_TOKENS",
    "MAX_FILE_BYTES",
    "from_attention",
    "read_attention_file",
]

#: the ``engine`` of a result made from attention computed elsewhere
IMPORTED_ENGINE = "imported"
#: token strings taken for special tokens when no model says which are (BERT, RoBERTa/BART,
#: T5, GPT-2, Llama 3, Gemma, ChatML); an unknown-word token is a word, as ``attend`` has it
KNOWN_SPECIAL_TOKENS = frozenset(
    {
        "[CLS]",
        "[BOS]",
        "[EOS]",
        "[SEP]",
        "[PAD]",
        "[MASK]",
        "<s>",
        "</s>",
        "<pad>",
        "<mask>",
        "<|endoftext|>",
        "<bos>",
        "<eos>",
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|eot_id|>",
        "<|im_start|>",
        "<|im_end|>",
    }
)
#: the files ``read_attention_file`` reads
ATTENTION_FILE_TYPES = ("npz", "pt")
#: the most bytes a file's arrays may unpack to (a compressed file is checked before unpacking)
MAX_FILE_BYTES = 256 * 2**20
_PATTERN_HOOK = re.compile(r"^blocks\.(\d+)\.attn\.hook_pattern$")
_WORD_STARTS = ("Ġ", "▁", " ", "Ċ")
_ROW_SUM_TOLERANCE = 1e-2  # 16-bit attention sums to 1 within a few thousandths


def _as_array(value: Any, what: str) -> np.ndarray:
    """A tensor (any device or dtype), an array, or nnsight's saved proxy as float32 numpy."""
    if hasattr(value, "value") and not hasattr(value, "shape"):  # nnsight < 0.4's saved proxy
        value = value.value
    if hasattr(value, "detach"):  # a torch tensor: off the graph, onto the CPU, out of 16 bits
        value = value.detach().to("cpu").float().numpy()
    try:
        return np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} is not a tensor or an array of numbers: {e}") from e


def _one_text(array: np.ndarray, what: str, batch_index: int) -> np.ndarray:
    """``[heads, q, k]`` of one text from ``[batch, heads, q, k]`` (or ``[heads, q, k]``)."""
    if array.ndim == 3:
        return array
    if array.ndim != 4:
        raise InputError(
            f"{what} must be [batch, heads, queries, keys] (or [heads, queries, keys]), "
            f"got shape {list(array.shape)}."
        )
    if not -array.shape[0] <= batch_index < array.shape[0]:
        raise InputError(f"batch_index {batch_index} is outside {what}'s {array.shape[0]} texts.")
    return array[batch_index]


def _cache_layers(cache: Any) -> list[Any]:
    """The pattern hooks of a TransformerLens ``ActivationCache`` (or a dict of hook names), in
    layer order."""
    names = list(cache.keys())  # an ActivationCache is not a dict
    found = {int(m.group(1)): key for key in names if (m := _PATTERN_HOOK.match(str(key)))}
    if not found:
        raise InputError(
            "This cache holds no attention pattern (no 'blocks.{layer}.attn.hook_pattern'): run "
            "the model with run_with_cache and do not filter the pattern hooks out."
        )
    layers = sorted(found)
    if layers != list(range(len(layers))):
        raise InputError(
            f"The cache holds the patterns of layers {layers}: from_attention needs every "
            "layer from 0 (rollout and the layer numbers read them in order)."
        )
    return [cache[found[layer]] for layer in layers]


def stacked_attention(attention: Any, *, batch_index: int = 0) -> np.ndarray:
    """``[layers, heads, q, k]`` float32 from any of ``from_attention``'s inputs.

    Raises:
        InputError: an input of another kind or shape (the message says which are read).
    """
    if hasattr(attention, "keys") and not hasattr(attention, "shape"):
        layers = [_as_array(a, f"layer {i}") for i, a in enumerate(_cache_layers(attention))]
        return np.stack([_one_text(a, f"layer {i}", batch_index) for i, a in enumerate(layers)])
    if isinstance(attention, tuple | list):
        if not attention:
            raise InputError("No layers: the attention is an empty sequence.")
        if any(a is None for a in attention):
            raise InputError(
                "The attentions hold None: run the model with attn_implementation='eager' and "
                "output_attentions=True (other implementations return no weights)."
            )
        layers = [_as_array(a, f"layer {i}") for i, a in enumerate(attention)]
        shapes = {a.shape for a in layers}
        if len(shapes) > 1:
            raise InputError(f"The layers' attentions differ in shape: {sorted(shapes)}.")
        return np.stack([_one_text(a, f"layer {i}", batch_index) for i, a in enumerate(layers)])
    array = _as_array(attention, "attention")
    if array.ndim == 5:  # transformers' tuple stacked: [layers, batch, heads, q, k]
        return np.stack([_one_text(a, f"layer {i}", batch_index) for i, a in enumerate(array)])
    if array.ndim != 4:
        raise InputError(
            "attention must be transformers' outputs.attentions (a tuple of [batch, heads, q, k]), "
            "a stacked [layers, heads, q, k] tensor or array, a TransformerLens ActivationCache "
            f"or a list of per-layer tensors; got an array of shape {list(array.shape)}."
        )
    return array


def _check_weights(array: np.ndarray, n: int) -> None:
    """Attention probabilities of ``n`` tokens: finite, non-negative, rows summing to 1."""
    if array.shape[-2:] != (n, n):
        raise InputError(
            f"The attention is over {array.shape[-1]} keys and {array.shape[-2]} queries but "
            f"{n} tokens were given: give one token string per position (self-attention)."
        )
    if not np.isfinite(array).all() or (array < 0).any():
        raise InputError("The attention holds NaN, infinite or negative values.")
    sums = array.sum(axis=-1, dtype=np.float64)
    if np.abs(sums - 1).max() > _ROW_SUM_TOLERANCE:
        raise InputError(
            f"Attention rows must sum to 1 (the weights after softmax); one sums to "
            f"{sums.flat[np.argmax(np.abs(sums - 1))]:.4g}. Scores before the softmax "
            "(TransformerLens's hook_attn_scores) are not weights."
        )


def _guess_words(tokens: Sequence[str], special: Sequence[bool]) -> list[int]:
    """Words from the pieces' markers where no tokenizer aligns them: ``##`` continues a word
    (WordPiece, where a piece without it starts one); ``Ġ``, ``▁`` or a space starts one and a
    piece without it continues the word before (byte-level BPE, SentencePiece); punctuation
    is a word of its own; special tokens are -1."""
    marked = any(t.startswith(_WORD_STARTS) for t in tokens)
    out: list[int] = []
    word, joinable = -1, False
    for token, sp in zip(tokens, special, strict=True):
        if sp:
            out.append(-1)
            joinable = False
            continue
        punct = is_punctuation(token)
        joins = token.startswith("##") if not marked else not token.startswith(_WORD_STARTS)
        if punct or not (joins and joinable):
            word += 1
        out.append(word)
        joinable = not punct
    return out


def _token_facts(
    tokens: list[str], special: Sequence[bool] | None, lm: LoadedModel | None
) -> list[bool]:
    if special is not None:
        flags = [bool(s) for s in special]
        if len(flags) != len(tokens):
            raise InputError(f"special has {len(flags)} flags for {len(tokens)} tokens.")
        return flags
    if lm is not None:
        tok = lm.tokenizer
        names = set(tok.all_special_tokens) - {tok.unk_token}
        return [t in names for t in tokens]
    return [t in KNOWN_SPECIAL_TOKENS for t in tokens]


def from_attention(
    attention: Any,
    tokens: Sequence[str],
    *,
    model: str | LoadedModel | None = None,
    causal: bool | None = None,
    text: str | None = None,
    special: Sequence[bool] | None = None,
    batch_index: int = 0,
) -> AttentionResult:
    """An ``AttentionResult`` of attention computed elsewhere, so that every analysis that reads
    attention alone runs on it (``head_stats``, ``head_similarity``, ``attention_rollout``,
    ``detect_heads(result=...)``, ``attention_sinks``, the notebook views).

    Args:
        attention: transformers' ``outputs.attentions`` (a tuple of ``[batch, heads, q, k]``
            per layer, or those stacked: ``[layers, batch, heads, q, k]``), a stacked
            ``[layers, heads, q, k]`` tensor or array of one text, a
            TransformerLens ``ActivationCache`` (its ``blocks.{layer}.attn.hook_pattern``
            entries; a dict of those names reads the same), or a list of per-layer tensors
            saved with nnsight (``[batch, heads, q, k]`` or ``[heads, q, k]``). Weights after
            the softmax; torch tensors on any device and in any dtype are copied to float32.
        tokens: the token string of each position (``tokenizer.convert_ids_to_tokens(ids)``,
            TransformerLens's ``model.to_str_tokens(text)``).
        model: the model the attention came from (a name, folder or loaded model), when this
            library can load it: its tokenizer then says which tokens are special, its facts
            (layers, heads, parameters) are kept, and with ``text`` the tokens' character
            offsets and words are the tokenizer's, as ``attend`` gives them. None: the model
            is named ``"imported"`` and special tokens are those in ``KNOWN_SPECIAL_TOKENS``.
        causal: the model masks later tokens; None: read from the attention (no weight above
            the diagonal in any head).
        text: the text the tokens came from; None: the tokens joined by spaces.
        special: a flag per token, overriding what the model or ``KNOWN_SPECIAL_TOKENS`` say.
        batch_index: which text of a batch (inputs with a batch axis).

    Returns:
        A result of engine ``"imported"`` with float32 ``[layers, heads, n, n]`` attention.

    Raises:
        InputError: an input of another kind or shape, weights that are not probabilities
            (finite, non-negative, rows summing to 1 within 0.01), tokens of another length,
            cross-attention (queries and keys of different lengths).
    """
    tokens = [str(t) for t in tokens]
    array = np.ascontiguousarray(stacked_attention(attention, batch_index=batch_index))
    _check_weights(array, len(tokens))
    lm = None if model is None else resolve_model(model)
    flags = _token_facts(tokens, special, lm)
    offsets, word_ids = [(0, 0)] * len(tokens), _guess_words(tokens, flags)
    if lm is not None and text is not None:
        with lm.lock:
            encoded = encode(lm, check_text(text, "the text"), None, None)
        if list(encoded.tokens.strings) == tokens:  # the tokenizer's own alignment
            offsets, word_ids = list(encoded.tokens.offsets), list(encoded.tokens.word_ids)
            flags = list(encoded.tokens.special) if special is None else flags
    if causal is None:
        causal = not np.triu(array, k=1).any()
    return AttentionResult(
        text=" ".join(tokens) if text is None else text,
        tokens=tokens,
        attention=array,
        offsets=offsets,
        special=flags,
        punctuation=[is_punctuation(t) and not s for t, s in zip(tokens, flags, strict=True)],
        word_ids=word_ids,
        model=IMPORTED_ENGINE if lm is None else lm.display_name,
        engine=IMPORTED_ENGINE,
        device="cpu",
        num_parameters=0 if lm is None else lm.num_parameters,
        causal=bool(causal),
        facts={} if lm is None else lm.facts(),
    )


def _unpacked_size(data: bytes, name: str) -> None:
    """Refuse an archive (``.npz`` and ``.pt`` are zip files) that unpacks to more than
    ``MAX_FILE_BYTES``, before anything is unpacked."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            size = sum(info.file_size for info in archive.infolist())
    except zipfile.BadZipFile as e:
        raise InputError(f"{name} is not a .npz or .pt file (not a zip archive).") from e
    if size > MAX_FILE_BYTES:
        raise InputError(
            f"{name} unpacks to {size / 2**20:,.0f} MB; at most {MAX_FILE_BYTES / 2**20:.0f} MB."
        )


def _read_npz(data: bytes, name: str) -> AttentionResult:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            if "header" in arrays.files:  # a result saved by AttentionResult.save
                return AttentionResult.load(io.BytesIO(data))  # type: ignore[arg-type]
            if not {"attention", "tokens"} <= set(arrays.files):
                raise InputError(
                    f"{name} needs two arrays, 'attention' [layers, heads, n, n] and 'tokens' "
                    f"(n strings); it holds {', '.join(arrays.files) or 'none'}."
                )
            attention, tokens = arrays["attention"], arrays["tokens"]
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise InputError(f"{name} could not be read as .npz: {e}") from e
    if tokens.dtype.kind not in "US":
        raise InputError(f"{name}'s 'tokens' must be strings, got {tokens.dtype}.")
    return from_attention(attention, [str(t) for t in tokens.reshape(-1)])


def _read_pt(data: bytes, name: str) -> AttentionResult:
    import pickle

    import torch

    try:  # weights_only: tensors and plain containers only, never arbitrary objects
        saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, ValueError, EOFError) as e:
        raise InputError(f"{name} could not be read as a tensor file: {e}") from e
    if not isinstance(saved, dict) or not {"attention", "tokens"} <= set(saved):
        raise InputError(
            f"{name} must hold a dict with 'attention' (a tensor [layers, heads, n, n] or "
            "transformers' tuple of layers) and 'tokens' (a list of strings)."
        )
    tokens = saved["tokens"]
    if not isinstance(tokens, list | tuple) or not all(isinstance(t, str) for t in tokens):
        raise InputError(f"{name}'s 'tokens' must be a list of strings.")
    return from_attention(saved["attention"], tokens)


def read_attention_file(data: bytes, name: str) -> AttentionResult:
    """Attention and tokens from a file (the app's upload): ``from_attention`` of its contents.

    - ``.npz``: arrays ``attention`` (``[layers, heads, n, n]``, or transformers' layout with a
      batch of one) and ``tokens`` (n strings), read without pickle; or a result written by
      ``AttentionResult.save``;
    - ``.pt``: ``torch.save({"attention": ..., "tokens": [...]}, path)``, read with
      ``torch.load(weights_only=True)``: tensors and plain containers only, never an object
      the file asks for.

    Args:
        data: the file's bytes.
        name: its name (the extension says which kind; shown in messages as text).

    Raises:
        InputError: another extension, a file that is not one of these or unpacks to more than
            ``MAX_FILE_BYTES``, arrays missing, or what ``from_attention`` refuses.
    """
    kind = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if kind not in ATTENTION_FILE_TYPES:
        raise InputError(f"{name}: give a .npz or .pt file.")
    _unpacked_size(data, name)
    return _read_npz(data, name) if kind == "npz" else _read_pt(data, name)
