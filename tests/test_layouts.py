"""Every registered family's layer layout (``Family.layers``) names the modules its models really
use, checked on the tiny random model of every family and variant with forward hooks: the
attention norm's output is what the attention block reads, the MLP norm's what the MLP reads,
the MLP's output what the layer adds, the final norm reads the last layer's output and gives
the model's last hidden state. No module of ``mhsa`` outside ``mhsa.engine.families`` looks a
layer's parts up by a list of names, and circuits and the residual decomposition read the same
norms (one source).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mhsa.circuits.layers import layer_norms
from mhsa.engine.families import layout
from mhsa.engine.families.record import LayerLayout
from mhsa.engine.families.registry import FAMILIES, family_of
from tests.tiny import tiny_seq2seq
from tests.tiny_families import TINY_FAMILIES, tiny_family_model

_IDS = torch.tensor([[5, 17, 42, 7, 99, 3, 11]])
_DECODER_IDS = torch.tensor([[0, 5, 9, 23]])
_ATOL = 1e-5

#: the tiny models: every family and variant of ``TINY_FAMILIES``, and mBART's and Marian's
#: layers (the BART family's pre-norm and post-norm layouts)
_MODELS = {
    **{name: lambda name=name: tiny_family_model(name) for name in TINY_FAMILIES},
    "BART family mbart": lambda: tiny_seq2seq("mbart"),
    "BART family marian": lambda: tiny_seq2seq("marian"),
}


def test_every_registered_family_has_a_layout_and_a_tiny_model() -> None:
    for family in FAMILIES:
        assert isinstance(family.layers, LayerLayout), family.name
        assert family.layers.attention and family.layers.projections, family.name
        assert family.name in TINY_FAMILIES


def _layers(base: nn.Module) -> list[tuple[str, nn.Module, nn.Module]]:
    """``(name, layer, attention block)`` of every layer of ``base``, in module order: the
    nearest module above a self-attention block whose layout names that block (cross-attention
    blocks are named by none)."""
    found = []
    for name, module in base.named_modules():
        family = family_of(module)
        if family is None:
            continue
        path = name.split(".")
        for cut in range(len(path) - 1, 0, -1):
            owner = base.get_submodule(".".join(path[:cut]))
            if layout.part_of(owner, family.layers.attention) is module:
                found.append((".".join(path[:cut]), owner, module))
                break
    return found


def _first(output):
    return output[0] if isinstance(output, tuple) else output


class _Calls:
    """Every call's input and output of the hooked modules, by module, in call order."""

    def __init__(self) -> None:
        self.calls: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = defaultdict(list)
        self.handles = []

    def watch(self, module: nn.Module | None) -> None:
        if module is None or id(module) in self.calls:
            return
        self.calls[id(module)] = []

        def hook(_m, args, kwargs, out):
            given = args[0] if args else kwargs["hidden_states"]
            kept = (given, _first(out))  # Marian's sinusoidal positions take a shape
            self.calls[id(module)].append(
                tuple(t.detach().clone() if torch.is_tensor(t) else t for t in kept)
            )

        self.handles.append(module.register_forward_hook(hook, with_kwargs=True))

    def of(self, module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.calls[id(module)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=_ATOL, rtol=1e-4))


@pytest.mark.parametrize("name", list(_MODELS))
def test_the_layout_names_the_modules_the_model_uses(name: str) -> None:
    head = _MODELS[name]().eval()
    base = head.base_model
    lm = SimpleNamespace(model=base, head_model=head, display_name=name)
    family = layout.family_of_model(base)
    assert family is not None and name.startswith(family.name)
    layers = _layers(base)
    assert layers, "no layer found through the layout"
    assert embeddings_ok(lm, head)

    calls = _Calls()
    parts = {}
    for lname, layer, block in layers:
        assert layout.family_of_layer(layer) is family
        assert layout.attention_of(layer) is block
        for projection in family.layers.projections:
            assert layout.part_of(block, projection) is not None, projection
        parts[lname] = {
            "layer": layer,
            "attention": block,
            "attention norm": layout.attention_norm_of(layer),
            "mlp norm": layout.mlp_norm_of(layer),
            "mlp": layout.mlp_of(layer),
            "mlp input": layout.mlp_input_of(layer),
            "post attention": layout.post_attention_norm_of(layer),
            "post mlp": layout.post_mlp_norm_of(layer),
            "attention sum": layout.attention_sum_norm_of(layer),
            "mlp sum": layout.mlp_sum_norm_of(layer),
        }
        assert parts[lname]["mlp"] is not None
        for module in parts[lname].values():
            calls.watch(module)
    final, encoder_final = layout.part_of(base, family.layers.final_norm), None
    if family.layers.encoder_final_norm is not None:
        encoder_final = layout.part_of(base, family.layers.encoder_final_norm)
    calls.watch(final)
    calls.watch(encoder_final)
    positions = layout.part_of(base, family.layers.positions)
    embedding_norm = layout.part_of(base, family.layers.embedding_norm)
    calls.watch(positions)
    calls.watch(embedding_norm)

    seq2seq = bool(getattr(head.config, "is_encoder_decoder", False))
    inputs = {"input_ids": _IDS, **({"decoder_input_ids": _DECODER_IDS} if seq2seq else {})}
    try:
        with torch.no_grad():
            out = base(**inputs, output_hidden_states=True)
    finally:
        calls.remove()
    last = getattr(out, "last_hidden_state", None)
    last = out.decoder_hidden_states[-1] if last is None else last

    for lname, p in parts.items():
        layer_calls = calls.of(p["layer"])
        assert layer_calls, f"{lname} not called"
        for i, (x, y) in enumerate(layer_calls):
            attn_in, attn_out = calls.of(p["attention"])[i]
            mlp_in = calls.of(p["mlp input"])[i][0]
            mlp_out = calls.of(p["mlp"])[i][1].reshape(x.shape)  # OPT's MLP runs on [B T, D]
            mlp_read = mlp_in.reshape(x.shape)
            if p["attention norm"] is not None:  # pre-norm: the norm reads the layer's input
                norm_in, norm_out = calls.of(p["attention norm"])[i]
                assert _same(norm_in, x), f"{lname}: the attention norm reads another tensor"
                assert _same(norm_out, attn_in), f"{lname}: attention reads another tensor"
            if p["mlp norm"] is not None:
                assert _same(calls.of(p["mlp norm"])[i][1].reshape(x.shape), mlp_read)
            elif family.parallel is not None and family.parallel(p["attention"]):
                assert _same(calls.of(p["attention norm"])[i][1], mlp_read)
            if p["mlp sum"] is not None:  # post-norm: the MLP's sum is normed into the output
                sum_in, sum_out = calls.of(p["mlp sum"])[i]
                assert _same(sum_out, y), f"{lname}: the layer's output is another norm's"
                before = calls.of(p["attention sum"])[i][1]
                if lname.startswith("decoder."):  # a cross-attention's sum comes between
                    before = mlp_read
                assert _same(before, mlp_read), f"{lname}: the MLP reads another tensor"
                assert _same(sum_in, before + mlp_out), f"{lname}: the MLP adds another tensor"
            elif not seq2seq:  # pre-norm: the output is the input plus what the blocks add
                added_attn, added_mlp = attn_out, mlp_out
                if p["post attention"] is not None:
                    post_in, added_attn = calls.of(p["post attention"])[i]
                    assert _same(post_in, attn_out)
                if p["post mlp"] is not None:
                    post_in, added_mlp = calls.of(p["post mlp"])[i]
                    assert _same(post_in, mlp_out)
                assert _same(y, x + added_attn + added_mlp), f"{lname}: another sum"
    last_layer = calls.of(layers[-1][1])[-1][1]
    if final is not None:
        norm_in, norm_out = calls.of(final)[-1]
        assert _same(norm_in, last_layer), "the final norm reads another tensor"
        assert _same(norm_out, last), "the final norm's output is not the last hidden state"
    else:
        assert family.kinds != ("decoder",), "a decoder without a final norm"
        assert _same(last_layer, last)
    if encoder_final is not None:
        encoder_last = [layer for lname, layer, _ in layers if lname.startswith("encoder.")][-1]
        assert _same(calls.of(encoder_final)[-1][0], calls.of(encoder_last)[-1][1])
    for module in (positions, embedding_norm):
        assert module is None or calls.of(module), "a named embedding part is never called"


def embeddings_ok(lm, head: nn.Module) -> bool:
    """The layout's token embedding and unembedding are the model's own."""
    assert layout.embeddings_of(lm).weight is head.get_input_embeddings().weight
    assert layout.unembedding_of(lm) is head.get_output_embeddings()
    return True


def test_a_layer_finds_its_family_through_our_block_while_it_stands_in() -> None:
    from mhsa.engine.runs.swap import OurBlock

    head = tiny_family_model("GPT-2 family").eval()
    layer = head.transformer.h[0]
    family = layout.family_of_model(head.transformer)
    ours = family.load(layer.attn, head.transformer)
    block = OurBlock(
        family,
        layer.attn,
        ours,
        layer=0,
        place=(layer, "attn"),
        layer_place=(head.transformer.h, "0"),
    )
    stand_in = nn.Module()
    stand_in.attn = block
    stand_in.ln_1 = layer.ln_1
    assert layout.family_of_layer(stand_in) is family
    assert layout.attention_norm_of(stand_in) is layer.ln_1


# --- one source ------------------------------------------------------------------------------

_FAMILIES_DIR = Path("mhsa") / "engine" / "families"

#: every part's own attribute name a family's layout gives (the last step of a path:
#: ``"attention.output.LayerNorm"`` gives ``LayerNorm``), and those its functions look up: the
#: names a list lookup elsewhere would repeat
_LAYOUT_NAMES = {
    value.rsplit(".", 1)[-1]
    for family in FAMILIES
    for value in vars(family.layers).values()
    if isinstance(value, str)
} | {"ln_attn", "ln_mlp", "post_attention_layernorm", "self_attn_layer_norm", "fc1", "fc2"}


def _name_lists(tree: ast.AST) -> list[tuple[int, list[str]]]:
    """Tuples and lists of two or more string constants of which at least two are layout
    names: ``(line, names)``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List) and len(node.elts) >= 2:
            names = [
                e.value
                for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
            if len(names) == len(node.elts) and len(set(names) & _LAYOUT_NAMES) >= 2:
                found.append((node.lineno, names))
    return found


def _dynamic_lookups(tree: ast.AST) -> bool:
    """Whether the source calls ``getattr``/``hasattr`` with a name that is no constant."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and not isinstance(node.args[1], ast.Constant)
        ):
            return True
    return False


def _list_lookups(source: str) -> list[tuple[int, list[str]]]:
    """Lists of layer attribute names in a source that also looks attributes up by a name it
    computes: a lookup by a list of names (``for name in (...): getattr(layer, name)``, or the
    list kept in a constant and looped over in a helper)."""
    tree = ast.parse(source)
    return _name_lists(tree) if _dynamic_lookups(tree) else []


#: the lookups ``mhsa/circuits/layers.py`` kept before it read the layout
_OLD_CIRCUITS_LAYERS = """
_ATTENTION_NORMS = ("ln_1", "input_layernorm", "ln_attn")
_MLP_NORMS = ("ln_2", "post_attention_layernorm", "ln_mlp")


def _child(module, names):
    for name in names:
        found = getattr(module, name, None)
        if found is not None:
            return found
    return None
"""


def test_the_list_lookup_check_finds_the_old_circuit_norm_lists() -> None:
    found = _list_lookups(_OLD_CIRCUITS_LAYERS)
    assert [names for _, names in found] == [
        ["ln_1", "input_layernorm", "ln_attn"],
        ["ln_2", "post_attention_layernorm", "ln_mlp"],
    ]
    inline = "def f(layer):\n    return [getattr(layer, n) for n in ('mlp', 'fc2')]\n"
    assert _list_lookups(inline)
    assert not _list_lookups("def f(layer):\n    return getattr(layer, 'mlp')\n")


def test_no_module_outside_the_families_looks_layer_parts_up_by_a_list_of_names() -> None:
    offenders = []
    for path in sorted(Path("mhsa").rglob("*.py")):
        if _FAMILIES_DIR in path.parents:
            continue
        for line, names in _list_lookups(path.read_text()):
            offenders.append(f"{path}:{line} {names}")
    assert not offenders, "\n".join(offenders)


_DECODERS = [f.name for f in FAMILIES if f.kinds == ("decoder",)]
_DECODER_MODELS = [n for n in TINY_FAMILIES if any(n.startswith(f) for f in _DECODERS)]


@pytest.mark.parametrize("name", _DECODER_MODELS)
def test_circuits_and_attribution_read_the_same_norms(name: str) -> None:
    head = tiny_family_model(name).eval()
    base = head.base_model
    family = layout.family_of_model(base)
    for _, layer, block in _layers(base):
        parallel = family.parallel is not None and family.parallel(block)
        attribution = layout.attention_norm_of(layer)
        if layout.post_norms_of(layer) or attribution is None:
            with pytest.raises(ValueError, match="norms after attention"):
                layer_norms(layer, parallel, ValueError)
            continue
        if layout.mlp_input_of(layer) is not layout.mlp_of(layer):  # OPT: norms found, refused
            assert layout.mlp_norm_of(layer) is not None
            with pytest.raises(ValueError, match="no module of its own"):
                layer_norms(layer, parallel, ValueError)
            continue
        norms = layer_norms(layer, parallel, ValueError)
        assert norms[0] is attribution
        assert norms[1] is (layout.mlp_norm_of(layer) or attribution)
