"""A head's true attention on an atlas's texts, computed once per text for every head.

The atlas keeps each head's strongest pairs, not its whole pattern; a program is scored against
the whole pattern, so the texts scored are run again through the atlas's model as the atlas's
build ran them (``mhsa.atlas.build``): the same tokens (cut at the atlas's ``max_tokens``), in
padded batches of similar length, every attention block swapped for our module
(``mhsa.engine.runs.forward.our_attention``: per-head weights, the model's weights), with each
key's value norm ``||f_h(x_k)||`` from the per-head V our module computes anyway
(``mhsa.engine.runs.norms.norm_observers``, Kobayashi et al. 2020: the atlas's "norm" is the
weight times it). Padding keys get zero weight, and each text's arrays are cut to its tokens.

``TextAttention`` per text holds every head of the atlas (in ``atlas.labels`` order); the
results are cached per atlas folder in this process (``attention_of``), bounded in bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mhsa.atlas.reader import Atlas, AtlasParts
from mhsa.engine.encoding import Encoded, encode
from mhsa.engine.models.loading import get_model
from mhsa.engine.runs.batches import batch_tokens_for, length_batches, pad_inputs
from mhsa.engine.runs.forward import our_attention
from mhsa.engine.runs.norms import norm_observers
from mhsa.engine.runs.swap import our_blocks
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.explain.programs import TextFeatures

__all__ = [
    "CACHE_BYTES",
    "TextAttention",
    "atlas_features",
    "atlas_tags",
    "attention_of",
    "check_atlas",
    "clear_cache",
]

#: bytes of attention kept per process across atlases (least recently used dropped first)
CACHE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class TextAttention:
    """One text's attention under every head of an atlas.

    Attributes:
        text_id: the atlas's text id.
        features: what programs read of the text (``TextFeatures``).
        weights: ``[heads, n, n]`` float32, heads in ``atlas.labels`` order.
        norms: ``[heads, n]`` float32: each key's value norm after the head's slice of W_O.
    """

    text_id: int
    features: TextFeatures
    weights: np.ndarray
    norms: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.weights.nbytes + self.norms.nbytes)


def check_atlas(atlas: Atlas) -> None:
    """Explanations read one self-attention: an encoder's or a decoder's atlas.

    Raises:
        UnsupportedModelError: an encoder-decoder's atlas of two parts.
    """
    if isinstance(atlas, AtlasParts):
        raise UnsupportedModelError(
            "Explanations cover the self-attention of encoders and decoders; an "
            "encoder-decoder's atlas holds two parts: open one part's atlas "
            "(atlas.parts['encoder'] or atlas.parts['decoder']) instead."
        )


def atlas_tags(atlas: Atlas, text_id: int) -> tuple[str | None, ...] | None:
    """The atlas's tag of each token of the text, or None for a corpus without tags."""
    if not atlas.has_tags:
        return None
    return tuple(atlas.tags(text_id))


def atlas_features(atlas: Atlas, text_id: int, encoded: Encoded | None = None) -> TextFeatures:
    """What programs read of the atlas's text ``text_id``: its tokens as the atlas holds them,
    their words (from the model's tokenizer), their tags where the corpus has them.

    Raises:
        InputError: the tokenizer no longer gives the atlas's tokens (built by another version:
            build the atlas again).
    """
    check_atlas(atlas)
    if encoded is None:
        lm = get_model(atlas.model)
        with lm.lock:
            encoded = _encode(lm, atlas, text_id)
    tokens = encoded.tokens
    if list(tokens.strings) != atlas.text_tokens(text_id):
        raise InputError(
            f"The model's tokenizer splits text {text_id} into other tokens than the atlas "
            "holds (it was built by another version): build the atlas again."
        )
    causal = bool(atlas.manifest["plan"]["causal"])
    return TextFeatures.of(tokens, causal=causal, tags=atlas_tags(atlas, text_id))


def _encode(lm, atlas: Atlas, text_id: int) -> Encoded:
    return encode(lm, atlas.text(text_id), None, int(atlas.manifest["plan"]["max_tokens"]))


def _compute(atlas: Atlas, text_ids: Sequence[int]) -> list[TextAttention]:
    """The attention and value norms of the texts under every head of the atlas."""
    plan = atlas.manifest["plan"]
    lm = get_model(atlas.model)
    layers, heads = list(plan["layers"]), list(plan["heads"])
    with lm.lock:
        encoded = [_encode(lm, atlas, t) for t in text_ids]
    features = [atlas_features(atlas, t, e) for t, e in zip(text_ids, encoded, strict=True)]
    lengths = [len(f) for f in features]
    out: list[TextAttention | None] = [None] * len(text_ids)
    for batch in length_batches(lengths, batch_tokens_for(lm, plan.get("batch_tokens"))):
        with lm.lock, torch.inference_mode():
            inputs = pad_inputs(lm, [encoded[i].inputs for i in batch])
            inputs = {k: v.to(lm.device) for k, v in inputs.items()}
            blocks = our_blocks(lm)
            norms: dict[int, torch.Tensor] = {}
            weights, _ = our_attention(
                lm, blocks, inputs, whole=False, observers=norm_observers(blocks, norms)
            )
            w = weights[layers][:, :, heads].float().cpu().numpy()  # [L', B, H', T, T]
            v = torch.stack([norms[layer][:, heads] for layer in layers]).float().cpu().numpy()
        for row, i in enumerate(batch):
            n = lengths[i]
            out[i] = TextAttention(
                int(text_ids[i]),
                features[i],
                np.ascontiguousarray(w[:, row, :, :n, :n].reshape(-1, n, n)),
                np.ascontiguousarray(v[:, row, :, :n].reshape(-1, n)),
            )
    return [o for o in out if o is not None]


class _Cache:
    """Per (atlas, text id) the text's ``TextAttention``, least recently used dropped
    beyond ``CACHE_BYTES``; shared by threads (the app's sessions)."""

    def __init__(self) -> None:
        self.items: OrderedDict[tuple[str, int], TextAttention] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, atlas: Atlas, text_ids: Sequence[int]) -> list[TextAttention]:
        # the build's time too: an atlas built again in the same folder is another atlas
        folder = f"{atlas.folder.resolve()}@{atlas.manifest.get('built', '')}"
        with self.lock:
            found = {t: self.items.get((folder, t)) for t in text_ids}
            for t, item in found.items():
                if item is not None:
                    self.items.move_to_end((folder, t))
        missing = [t for t, item in found.items() if item is None]
        if missing:
            for item in _compute(atlas, missing):
                found[item.text_id] = item
                with self.lock:
                    key = (folder, item.text_id)
                    if key not in self.items:
                        self.items[key] = item
                        self.bytes += item.nbytes
                    while self.bytes > CACHE_BYTES and len(self.items) > 1:
                        _, old = self.items.popitem(last=False)
                        self.bytes -= old.nbytes
        return [found[t] for t in text_ids]


_CACHE = _Cache()


def attention_of(atlas: Atlas, text_ids: Sequence[int]) -> list[TextAttention]:
    """The texts' attention under every head of the atlas (texts with tokens only), computed
    once per process and text (``CACHE_BYTES``).

    Raises:
        UnsupportedModelError: an encoder-decoder's atlas (one part's atlas is accepted).
    """
    check_atlas(atlas)
    return _CACHE.get(atlas, [int(t) for t in text_ids])


def clear_cache() -> None:
    """Forget every cached attention (tests, or after an atlas is built again)."""
    with _CACHE.lock:
        _CACHE.items.clear()
        _CACHE.bytes = 0
