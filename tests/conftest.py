"""Shared fixtures: the embedded model once per session, tiny random models built offline."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub look-ups (and no 25 s of retries) in tests
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the app's atlases (the Head atlas page): a small one built once per session, never the user's
_ATLASES = os.path.join(tempfile.mkdtemp(prefix="mhsa-test-atlases-"), "atlases")
os.environ["MHSA_ATLAS_DIR"] = _ATLASES

import pytest  # noqa: E402  (after the environment above)

import mhsa  # noqa: E402
from tests.tiny import DECODER_SIZES, save_tiny, tiny_bert, tiny_seq2seq  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def app_atlas() -> str:
    """The Head atlas page's atlas for the tests: MiniLM over 24 sentences of the project's own
    corpus, under the shipped atlas's name (the page opens it for the default model)."""
    from pathlib import Path

    from mhsa.atlas import build_atlas
    from mhsa.atlas.shipped import DEFAULT_ATLASES

    lines = (Path(__file__).parent.parent / "data" / "sentences.txt").read_text().splitlines()
    folder = Path(_ATLASES) / DEFAULT_ATLASES["default"]
    build_atlas(lines[:24], folder, model="default", top_k=8, progress=False, sample_size=200)
    return str(folder)


#: texts of the explained toy atlas (``explained_toy_atlas``): enough held-out texts to score on
TOY_ATLAS_TEXTS = 120


@pytest.fixture(scope="session")
def explained_toy_atlas(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder of atlases holding ``toy-induction`` (the shipped atlas's name) over the first
    ``TOY_ATLAS_TEXTS`` texts of its task, with every head explained and saved, apart from the
    session's atlas folder (``with_toy_atlas`` lists it first)."""
    import mhsa.explain
    from mhsa.atlas import build_atlas
    from mhsa.atlas.corpora import default_corpus

    root = tmp_path_factory.mktemp("explained-atlases")
    texts = default_corpus("toy:induction", TOY_ATLAS_TEXTS)[:TOY_ATLAS_TEXTS]
    atlas = build_atlas(texts, root / "toy-induction", model="toy:induction", progress=False)
    mhsa.explain.explain_heads(atlas, progress=False, save=True)
    return str(root)


@pytest.fixture(scope="session")
def minilm() -> mhsa.engine.LoadedModel:
    return mhsa.load_model("default", device="cpu")


def _save_tiny(tmp_path_factory: pytest.TempPathFactory, name: str, model) -> str:
    return save_tiny(tmp_path_factory.mktemp(name), model)


@pytest.fixture(scope="session")
def tiny_gpt2_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=30522, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    # with its language-model head, as GPT-2 checkpoints come (lm-loss target)
    return _save_tiny(tmp_path_factory, "gpt2", GPT2LMHeadModel(config))


@pytest.fixture(scope="session")
def tiny_bert_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The embedded model's architecture and tokenizer (a BertModel, WordPiece, 512 positions)
    at 2 layers of 4 heads, width 32: its tokens are the default model's, its runs a fraction
    of the cost. The page tests' model wherever the model is not what is tested
    (``tests/app/conftest.py``'s ``tiny_bert`` allows it in links)."""
    import torch

    torch.manual_seed(0)
    return _save_tiny(tmp_path_factory, "bert", tiny_bert())


@pytest.fixture(scope="session")
def tiny_bert_sharp_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``tiny_bert_path``'s model with its matrices at ten times BERT's initial scale: heads
    that attend sharply and matter (leave-one-out changes of 1e-2, not 1e-5), for checks whose
    tolerance must be small against the values, where MiniLM's cost is not what is tested."""
    import torch

    torch.manual_seed(1)
    model = tiny_bert()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    return _save_tiny(tmp_path_factory, "bert-sharp", model)


@pytest.fixture(scope="session")
def tiny_bert_model(tiny_bert_path: str) -> mhsa.engine.LoadedModel:
    """``tiny_bert_path`` loaded once: the library's side of a page test on the tiny BERT."""
    return mhsa.load_model(tiny_bert_path, device="cpu")


@pytest.fixture(scope="session")
def tiny_bert_mlm_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A BERT with its masked-LM head (bert-base-uncased's layout, tiny)."""
    import torch

    torch.manual_seed(0)
    model = tiny_bert("BertForMaskedLM", positions=64)
    return _save_tiny(tmp_path_factory, "bert-mlm", model)


@pytest.fixture(scope="session")
def tiny_distilbert_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=30522, max_position_embeddings=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64
    )
    return _save_tiny(tmp_path_factory, "distilbert", DistilBertModel(config))


@pytest.fixture(scope="session")
def tiny_t5_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    import torch
    from transformers import T5Config, T5Model

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=30522,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return _save_tiny(tmp_path_factory, "t5", T5Model(config))


@pytest.fixture(scope="session", params=["bart", "marian", "t5"])
def tiny_seq2seq_path(request, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Tiny random BART, Marian and T5 folders with their generation heads (one per param)."""
    return _save_tiny(tmp_path_factory, request.param, tiny_seq2seq(request.param))


@pytest.fixture(scope="session")
def tiny_bart_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random BART with its generation head (the page tests' encoder-decoder)."""
    return _save_tiny(tmp_path_factory, "bart-cg", tiny_seq2seq("bart"))


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Llama with grouped-query attention (4 query heads share 2 key/value heads) and llama3
    rope scaling, so that the loaded frequencies are not the plain RoPE ones."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **DECODER_SIZES,
        num_key_value_heads=2,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    return _save_tiny(tmp_path_factory, "llama", LlamaForCausalLM(config))


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen2: biases on Q/K/V but not on the output projection; 4 query heads, 1 key/value."""
    import torch
    from transformers import Qwen2Config, Qwen2Model

    torch.manual_seed(0)
    config = Qwen2Config(**DECODER_SIZES, num_key_value_heads=1)
    model = Qwen2Model(config)
    with torch.no_grad():  # non-zero Q/K/V biases, so that loading them is tested
        for layer in model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    return _save_tiny(tmp_path_factory, "qwen2", model)


@pytest.fixture(scope="session")
def tiny_mistral_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Mistral with a sliding window of 4 tokens, shorter than the test sentences."""
    import torch
    from transformers import MistralConfig, MistralModel

    torch.manual_seed(0)
    config = MistralConfig(**DECODER_SIZES, num_key_value_heads=2, sliding_window=4)
    return _save_tiny(tmp_path_factory, "mistral", MistralModel(config))
