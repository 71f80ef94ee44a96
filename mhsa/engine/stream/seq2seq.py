"""The two residual streams of an encoder-decoder (T5, BART families), part by part, as each
self-attention block reads them (``Seq2SeqPass``, ``seq2seq_pass``): what
``mhsa.analysis.qk_attribution.qk_attribution`` splits an encoder head's (``E{l}H{h}``) or a decoder
self-attention head's (``D{l}H{h}``) score over.

Each stack (the encoder; the decoder, teacher-forced on a target as ``mhsa.attend`` runs it)
has one stream, written by its attention blocks in the order the forward calls them (the
decoder: per layer its self-attention ``D{l}``, then its cross-attention ``C{l}``, whose heads
write into the decoder's stream like any head) and by each layer's MLP ``M{l}``. Two layouts:

- pre-norm (T5, Flan-T5, mBART): a block reads its norm of the stream (an RMSNorm in T5),
  frozen per position at the real stream (TransformerLens's ``apply_ln_to_stack``); the stream
  itself is the sum of the parts. An MLP's output (nonlinear in its input) is one part: what
  the stream gained between the layer's last attention block and the next layer's first,
  checked to be nothing between two blocks of one layer.
- post-norm (BART, Marian): ``x <- LN(x + written)`` after every attention block and every MLP,
  each LayerNorm's scale ``1 / sigma`` frozen per position, so that every part is pushed
  through the norms after the point where it was written (``mhsa.engine.stream.postnorm``'s
  chain, here with a decoder's three norms a layer).

Every constant (output biases, norm biases, the embedding norm's bias) is the part ``bias``.
The layout is found from the recorded pass, not from a name: post-norm when the first norm
after a block takes the block's own input plus its output, pre-norm when it takes the stream
the block's norm read plus its output; anything else is refused. T5's relative position bias,
added to the scores, is kept per head (``Seq2SeqPass.position``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mhsa.engine.encoding import check_text, encode
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.runs.generation import forward_inputs
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks
from mhsa.engine.stream.frozen_norm import FrozenNorm, frozen_norm
from mhsa.errors import UnsupportedModelError
from mhsa.heads import layer_name

__all__ = ["BlockStream", "Seq2SeqPass", "seq2seq_pass"]

#: a rebuilt stream may differ from the recorded one by this much of its largest value
_TOLERANCE = 1e-4


@dataclass(frozen=True, eq=False)
class BlockStream:
    """The stream one self-attention block reads, in parts. S parts, T tokens, D = d_model.

    Attributes:
        names: the parts' names: ``input``, the heads of every block before it in its stack
            (``E{l}H{h}``; a decoder's ``D{l}H{h}`` and ``C{l}H{h}``), each layer's MLP
            ``M{l}``, then ``bias``.
        sources: the parts ``[S, T, D]`` (float64).
        frozen: the norm the block reads the stream through (pre-norm), frozen per position
            at the real stream, or None (post-norm: the stream as it is).
        normed: what the block reads ``[T, D]`` (float64).
        values: each head's values as the pass computed them ``[G, T, Dh]`` (a check).
        position: a score bias per head ``[H, T, T]`` (T5's relative position bias), or None.
    """

    names: tuple[str, ...]
    sources: torch.Tensor
    frozen: FrozenNorm | None
    normed: torch.Tensor
    values: torch.Tensor
    position: torch.Tensor | None


@dataclass(frozen=True, eq=False)
class Seq2SeqPass:
    """One text's pass through an encoder-decoder, each self-attention block's stream in parts.

    Attributes:
        encoder_tokens, decoder_tokens: the tokens each stack reads.
        pre_norm: the layout found (see the module's docstring).
        streams: per block number (``OurBlock.layer``) of every self-attention block, its
            ``BlockStream``.
    """

    encoder_tokens: tuple[str, ...]
    decoder_tokens: tuple[str, ...]
    pre_norm: bool
    streams: dict[int, BlockStream]


def _refusal(lm: LoadedModel, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{lm.display_name}: {why}. Splitting an encoder-decoder's streams follows pre-norm "
        "layers (T5, mBART: each block reads a norm of the stream, which sums the blocks' "
        "outputs) and post-norm ones (BART, Marian: each block's output added to its input "
        "and put through a LayerNorm)."
    )


def _is_norm(module: nn.Module) -> bool:
    return "Norm" in type(module).__name__ and getattr(module, "weight", None) is not None


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    return bool(torch.allclose(a, b, atol=_TOLERANCE * (1.0 + float(b.abs().max()))))


def seq2seq_pass(
    text: str, text_pair: str | None, lm: LoadedModel, max_tokens: int | None = None
) -> Seq2SeqPass:
    """``text`` through the encoder-decoder ``lm`` (our module in every attention block), the
    decoder teacher-forced on ``text_pair`` (None: the text itself, as ``mhsa.attend``), each
    self-attention block's stream recorded in parts.

    Raises:
        UnsupportedModelError: not an encoder-decoder, or a layout neither pre- nor post-norm.
        InputError: the text is empty or too long.
    """
    text = check_text(text)
    if text_pair is not None:
        text_pair = check_text(text_pair, "target text")
    with lm.lock, torch.inference_mode():
        blocks = our_blocks(lm)
        if not lm.is_encoder_decoder:
            raise _refusal(lm, "not an encoder-decoder")
        encoded = encode(lm, text, text_pair, max_tokens)
        events: list[tuple[Any, ...]] = []
        handles = [
            m.register_forward_hook(
                lambda mod, args, out: events.append(("norm", mod, args[0][0], out[0]))
            )
            for m in lm.model.modules()
            if _is_norm(m)
        ]
        try:
            observers = {b.layer: _observer(events, b.layer) for b in blocks}
            inputs = forward_inputs(lm, encoded.inputs_on(lm.device), head=False)
            run_with_our_blocks(lm, blocks, OurPass(observers=observers), inputs)
        finally:
            for handle in handles:
                handle.remove()
    decoder_tokens = tuple(encoded.decoder_tokens or ())
    pre_norm, streams = _assembled(lm, blocks, events)
    return Seq2SeqPass(tuple(encoded.tokens.strings), decoder_tokens, pre_norm, streams)


_OBSERVED = ("X", "concatenated heads", "per-head V", "scaled scores", "masked scores")


def _observer(events: list[tuple[Any, ...]], layer: int):
    def observe(name: str, tensor: torch.Tensor) -> None:
        if name in _OBSERVED:
            events.append((name, layer, tensor[0].float().clone()))  # masking may be in place

    return observe


def _per_block(blocks: list[OurBlock], events: list[tuple[Any, ...]]) -> dict[int, dict]:
    """Per block: what our module saw (``X``, its heads, values, scores) and the norm events
    just before it (``before``) and after it up to the next block (``after``)."""
    starts = [i for i, e in enumerate(events) if e[0] == "X"]
    if len(starts) != len(blocks):
        raise RuntimeError("an attention block read the stream more than once")
    seen: dict[int, dict] = {}
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(events)
        layer = events[start][1]
        own = {e[0]: e[2] for e in events[start:end] if e[0] in _OBSERVED and e[1] == layer}
        previous = starts[n - 1] if n else 0
        own["before"] = [e for e in events[previous:start] if e[0] == "norm"]
        own["after"] = [e for e in events[start:end] if e[0] == "norm"]
        own["at"] = n  # the order the forward called the blocks in
        seen[layer] = own
    return seen


def _written(block: OurBlock, merged: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's output ``[H, T, D]`` (its context through its slice of ``W_O``) and the
    output bias ``[D]`` (zeros where there is none), float64."""
    ours = block.ours
    weight = ours.out.weight.detach().double()  # (D, H Dh)
    w_o = weight.view(weight.shape[0], ours.num_heads, ours.d_head).permute(1, 2, 0)
    context = merged.double().view(-1, ours.num_heads, ours.d_head).transpose(0, 1)
    bias = ours.out.bias
    constant = weight.new_zeros(weight.shape[0]) if bias is None else bias.detach().double()
    return torch.einsum("htd,hdm->htm", context, w_o), constant


def _assembled(
    lm: LoadedModel, blocks: list[OurBlock], events: list[tuple[Any, ...]]
) -> tuple[bool, dict[int, BlockStream]]:
    seen = _per_block(blocks, events)

    def called(kinds: tuple[str, ...]) -> list[OurBlock]:
        return sorted((b for b in blocks if b.kind in kinds), key=lambda b: seen[b.layer]["at"])

    stacks = {"encoder": called(("encoder",)), "decoder": called(("decoder", "cross"))}
    first = stacks["encoder"][0]
    heads, constant = _written(first, seen[first.layer]["concatenated heads"])
    after = seen[first.layer]["after"]
    x = seen[first.layer]["X"].double()
    pre_norm = not (after and _close(after[0][2].double(), x + heads.sum(0) + constant))
    streams: dict[int, BlockStream] = {}
    for stack in stacks.values():
        streams.update(_stack(lm, stack, seen, pre_norm))
    return pre_norm, streams


class _Chain:
    """The parts of one stack's stream so far (``[S, T, D]`` float64, ``bias`` last), grown
    by writes and pushed through frozen norms."""

    def __init__(self, first: torch.Tensor, bias: torch.Tensor) -> None:
        self.names = ["input"]
        self.parts = [first.double()]
        self.bias = bias.double().expand_as(self.parts[0]).clone()

    def write(self, names: list[str], parts: torch.Tensor, constant: torch.Tensor) -> None:
        self.names += names
        self.parts += list(parts)
        self.bias = self.bias + constant

    def norm(self, frozen: FrozenNorm) -> None:
        """Every part and ``bias`` through ``frozen``'s linear part; its bias into ``bias``."""
        *parts, bias = frozen(torch.stack([*self.parts, self.bias]))
        self.parts = list(parts)
        self.bias = bias + (0 if frozen.bias is None else frozen.bias)

    def whole(self) -> torch.Tensor:
        return torch.stack(self.parts).sum(0) + self.bias

    def stacked(self) -> tuple[tuple[str, ...], torch.Tensor]:
        return (*self.names, "bias"), torch.stack([*self.parts, self.bias])


def _frozen(norm: nn.Module, given: torch.Tensor) -> FrozenNorm:
    frozen = frozen_norm(norm, given)
    return FrozenNorm(
        frozen.kind,
        torch.as_tensor(frozen.inverse_scale).double(),
        frozen.weight.double(),
        None if frozen.bias is None else frozen.bias.double(),
    )


def _start(before: list[tuple[Any, ...]], stream: torch.Tensor) -> _Chain:
    """A stack's first parts: ``input`` is its embeddings' output, less the bias of an
    embedding norm that gave it (BART's ``layernorm_embedding``), which joins ``bias``."""
    for _, norm, _given, out in reversed(before):
        bias = getattr(norm, "bias", None)
        if bias is not None and _close(out.double(), stream):
            return _Chain(stream - bias.double(), bias.detach().double())
    return _Chain(stream, stream.new_zeros(stream.shape[-1]))


def _stack(
    lm: LoadedModel, stack: list[OurBlock], seen: dict[int, dict], pre_norm: bool
) -> dict[int, BlockStream]:
    """The ``BlockStream`` of every self-attention block of one stack, in call order."""
    streams: dict[int, BlockStream] = {}
    chain: _Chain | None = None
    for n, block in enumerate(stack):
        own = seen[block.layer]
        x = own["X"].double()
        read: FrozenNorm | None = None
        stream = x
        if pre_norm:
            norm = own["before"][-1] if own["before"] else None
            if norm is None or not _close(norm[3].double(), x):
                raise _refusal(lm, f"block {block.layer} does not read a norm of the stream")
            stream = norm[2].double()
            read = _frozen(norm[1], norm[2])
        if chain is None:
            chain = _start(own["before"][:-1] if pre_norm else own["before"], stream)
        elif pre_norm:  # what the stream gained since the block before: its layer's MLP
            gained = stream - chain.whole()
            previous = stack[n - 1]
            if previous.index == block.index and block.kind == "cross":
                if float(gained.abs().max()) > _TOLERANCE * (1.0 + float(stream.abs().max())):
                    raise _refusal(lm, f"something besides block {previous.layer} writes first")
            else:
                chain.write([f"M{previous.index}"], gained[None], torch.zeros_like(gained[0]))
        if not _close(chain.whole(), stream):
            raise _refusal(lm, f"the stream entering block {block.layer} is not its parts' sum")
        if block.kind != "cross":
            names, sources = chain.stacked()
            position = None
            if "masked scores" in own and block.family.score_bias is not None:
                position = (own["masked scores"] - own["scaled scores"]).double()
            normed = x if read is None else read(stream) + (0 if read.bias is None else read.bias)
            streams[block.layer] = BlockStream(
                names, sources, read, normed, own["per-head V"], position
            )
        heads, constant = _written(block, own["concatenated heads"])
        prefix = layer_name(block.kind, block.index)  # E0, D0, C0
        chain.write([f"{prefix}H{h}" for h in range(len(heads))], heads, constant)
        if not pre_norm:
            _post_norms(lm, block, stack, n, own["after"], chain)
    return streams


def _post_norms(
    lm: LoadedModel,
    block: OurBlock,
    stack: list[OurBlock],
    n: int,
    after: list[tuple[Any, ...]],
    chain: _Chain,
) -> None:
    """After a post-norm block (``after``: the norms the forward ran before the next block):
    the norm of its input plus its output; at the end of its layer, the MLP's output and the
    norm of the sum, each frozen where the forward ran it. The stack's last block may see the
    other stack's embedding norm after its own."""
    last_of_layer = n + 1 == len(stack) or stack[n + 1].index != block.index
    need = 2 if last_of_layer else 1
    count_ok = len(after) >= need if n + 1 == len(stack) else len(after) == need
    if not count_ok or not _close(after[0][2].double(), chain.whole()):
        raise _refusal(lm, f"block {block.layer} is not followed by a LayerNorm of its sum")
    chain.norm(_frozen(after[0][1], after[0][2]))
    if last_of_layer:
        given = after[1][2]
        mlp = given.double() - chain.whole()
        chain.write([f"M{block.index}"], mlp[None], torch.zeros_like(mlp[0]))
        chain.norm(_frozen(after[1][1], given))
