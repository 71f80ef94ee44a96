"""Text a causal language model (or an encoder-decoder's decoder) writes, kept as the ids it
chose, and attention over them."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mhsa.engine.encoding import Encoded, check_text, encode
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.tokens import Tokens, is_punctuation
from mhsa.errors import InputError

__all__ = [
    "MAX_NEW_TOKENS",
    "Generation",
    "continuation",
    "generate",
    "generate_ids",
    "generation_encoded",
]

#: most tokens ``generate`` adds (attention over prompt + generation stays explorable)
MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class Generation:
    """What a causal language model wrote after a prompt, or an encoder-decoder model's
    decoder wrote for it (the target), as the ids it chose.

    Attributes:
        prompt: the prompt as typed.
        ids: the prompt's encoding followed by the ids the model chose, exactly
            ``model.generate``'s output (an encoder-decoder: the prompt's encoding alone, the
            encoder's input).
        prompt_tokens: how many of ``ids`` are the prompt's.
        text: the prompt verbatim followed by the continuation as transformers'
            text-generation pipeline returns it (``continuation``; special tokens skipped):
            what ``generate`` returns (an encoder-decoder: the prompt).
        decoder_ids: an encoder-decoder's decoder ids, exactly ``model.generate``'s output
            (the decoder start token first); None for a causal model.
        target: ``decoder_ids`` decoded (special tokens skipped): what ``generate`` returns
            for an encoder-decoder; None for a causal model.
    """

    prompt: str
    ids: tuple[int, ...]
    prompt_tokens: int
    text: str
    decoder_ids: tuple[int, ...] | None = None
    target: str | None = None

    @property
    def new_ids(self) -> tuple[int, ...]:
        """The ids the model chose."""
        return self.ids[self.prompt_tokens :]


def forward_inputs(
    lm: LoadedModel, inputs: dict[str, torch.Tensor], head: bool = True
) -> dict[str, torch.Tensor]:
    """The inputs ``lm``'s forward names (a saved BERT tokenizer's ``token_type_ids`` make a
    Llama-family model's ``generate`` raise; GPT-2 takes them): its head model's, or with
    ``head=False`` its base model's."""
    module = lm.head_model if head and lm.head_model is not None else lm.model
    params = inspect.signature(module.forward).parameters
    named = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return {k: v for k, v in inputs.items() if k in named}


def generate_ids(
    text: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    max_new_tokens: int = 20,
    sample: bool = False,
    seed: int = 0,
    device: str = "auto",
) -> Generation:
    """What a causal language model writes after ``text`` (an encoder-decoder model: what its
    decoder writes for ``text``, the target): greedy, or sampled (temperature 1, the whole
    vocabulary) from ``seed``, kept as the ids it chose (``attend_generated`` shows attention
    over exactly those).

    Raises:
        InputError: the model has no next-token head, or the numbers are off.
    """
    text = check_text(text)
    lm = resolve_model(model, device)
    if lm.lm_head not in ("causal", "seq2seq"):
        raise InputError(
            f"{lm.display_name} has no next-token (causal language-model) head, so it cannot "
            "generate text: load a causal LM checkpoint (GPT-2, Llama, Qwen2, ...) or an "
            "encoder-decoder with its generation head (T5, BART, Marian)."
        )
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"Generate between 1 and {MAX_NEW_TOKENS} tokens, not {max_new_tokens}.")
    tok = lm.tokenizer
    with lm.lock, torch.inference_mode():
        inputs = forward_inputs(lm, encode(lm, text, None, None).inputs_on(lm.device))
        inputs.pop("decoder_input_ids", None)  # an encoder-decoder's decoder starts afresh
        prompt_tokens = inputs["input_ids"].shape[1]
        written = 1 if lm.is_encoder_decoder else prompt_tokens  # the decoder start token
        room = (lm.max_positions or 10**9) - written
        if room < 1:
            raise InputError("The prompt already fills the model's context: shorten it.")
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        how: dict[str, Any] = {"do_sample": False}
        if sample:
            how = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0}
        devices = [lm.device] if lm.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # the caller's random state is untouched
            torch.manual_seed(seed)
            out = lm.head_model.generate(
                **inputs, max_new_tokens=min(max_new_tokens, room), pad_token_id=pad, **how
            )
    ids = tuple(out[0].tolist())
    if lm.is_encoder_decoder:
        prompt_ids = tuple(inputs["input_ids"][0].tolist())
        target = tok.decode(list(ids), skip_special_tokens=True)
        return Generation(text, prompt_ids, prompt_tokens, text, ids, target)
    return Generation(text, ids, prompt_tokens, text + continuation(tok, ids, prompt_tokens))


def continuation(tokenizer: Any, ids: Sequence[int], prompt_tokens: int) -> str:
    """The text the ids after the first ``prompt_tokens`` add, as transformers' text-generation
    pipeline took it up to 4.x: the prompt and continuation decoded together (special tokens
    skipped), less the decoded prompt's length. Decoding the continuation on its own (the 5.x
    pipeline does) loses the space before it with a SentencePiece tokenizer (Llama-2, Mistral:
    its decoder strips the first space of what it decodes)."""
    whole = tokenizer.decode(list(ids), skip_special_tokens=True)
    head = tokenizer.decode(list(ids[:prompt_tokens]), skip_special_tokens=True)
    return whole[len(head) :]


def generate(
    text: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    max_new_tokens: int = 20,
    sample: bool = False,
    seed: int = 0,
    device: str = "auto",
) -> str:
    """The prompt ``text`` followed by what a causal language model writes next (an
    encoder-decoder model: what its decoder writes for ``text`` alone): greedy, or sampled
    (temperature 1, the whole vocabulary) from ``seed``. The prompt is kept verbatim
    (the continuation appended as decoding prompt and continuation together gives it:
    ``continuation``), so ``len(text)`` is where the generated characters begin.
    Re-tokenizing this text need not give the model's tokens back: ``generate_ids`` and
    ``attend_generated`` keep them.

    Raises:
        InputError: the model has no causal language-model head, or the numbers are off.
    """
    g = generate_ids(
        text, model=model, max_new_tokens=max_new_tokens, sample=sample, seed=seed, device=device
    )
    return g.text if g.target is None else g.target


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def generation_encoded(lm: LoadedModel, generation: Generation, max_tokens: int | None) -> Encoded:
    """``generation``'s ids as model inputs and tokens (``convert_ids_to_tokens``).

    The prompt's tokens keep the tokenizer's offsets and words. A generated token's span in
    ``generation.text`` is what decoding the continuation up to it adds (decoded progressively,
    held to the common prefix with the whole continuation so that spans stay in order and
    inside the text); it starts a new word after a space, a punctuation token, a special token
    or the prompt. A generated special token (EOS, [SEP]) gets the zero-width span where it was
    written, not ``(0, 0)``, so that it counts as generated too.

    Spans leave out the whitespace before a word, as fast tokenizers' offsets do.
    ``max_tokens``: keep the first this many tokens (the rest count as truncated).

    An encoder-decoder's generation: the prompt encoded for the encoder and the decoder's
    ids as its input (``decoder_input_ids``, the decoder start token first), the first
    ``max_tokens`` of each.

    Raises:
        InputError: the ids do not begin with this model's encoding of the prompt.
    """
    if generation.decoder_ids is not None:
        return _seq2seq_encoded(lm, generation, max_tokens)
    tok = lm.tokenizer
    prompt = encode(lm, generation.prompt, None, None)
    if prompt.inputs["input_ids"][0].tolist() != list(generation.ids[: generation.prompt_tokens]):
        raise InputError("This generation was made with another tokenizer: generate it again.")
    ids = list(generation.ids)
    base = len(generation.prompt)
    full = generation.text[base:]
    specials = set(tok.all_special_ids) - {tok.unk_token_id}
    new = ids[generation.prompt_tokens :]
    strings = tuple(tok.convert_ids_to_tokens(ids))
    offsets, special = list(prompt.tokens.offsets), list(prompt.tokens.special)
    words = list(prompt.tokens.word_ids)
    word = max(words, default=-1)
    end, boundary = 0, True
    for i, token_id in enumerate(new):
        if token_id in specials:  # a zero-width span where it was written: still generated
            offsets.append((base + end, base + end))
            special.append(True)
            words.append(-1)
            boundary = True
            continue
        decoded = continuation(tok, ids[: len(ids) - len(new) + i + 1], len(ids) - len(new))
        start, end = end, max(end, _common_prefix(full, decoded))
        piece = full[start:end]
        punct = is_punctuation(piece)
        if boundary or punct or piece[:1].isspace():
            word += 1
        lead = len(piece) - len(piece.lstrip()) if piece.strip() else 0
        offsets.append((base + start + lead, base + end))  # the space before a word left out
        special.append(False)
        words.append(word)
        boundary = punct
    keep = len(ids) if max_tokens is None else min(len(ids), max(1, max_tokens))
    tokens = Tokens(
        strings[:keep], tuple(offsets[:keep]), tuple(special[:keep]), tuple(words[:keep])
    )
    input_ids = torch.tensor([ids[:keep]])
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if "token_type_ids" in prompt.inputs:  # one segment: what generate extended the prompt's by
        inputs["token_type_ids"] = torch.zeros_like(input_ids)
    return Encoded(inputs, tokens, len(ids) - keep, None)


def _seq2seq_encoded(lm: LoadedModel, generation: Generation, max_tokens: int | None) -> Encoded:
    """``generation_encoded`` of an encoder-decoder's generation."""
    if not lm.is_encoder_decoder or generation.decoder_ids is None:
        raise InputError("This generation was made with another model: generate it again.")
    encoded = encode(lm, generation.prompt, None, max_tokens)
    ids = list(generation.decoder_ids)[: None if max_tokens is None else max(1, max_tokens)]
    inputs = dict(encoded.inputs, decoder_input_ids=torch.tensor([ids]))
    tokens = lm.tokenizer.convert_ids_to_tokens(ids)
    return dataclasses.replace(encoded, inputs=inputs, decoder_tokens=tokens)
