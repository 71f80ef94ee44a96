"""Shared fixtures: the embedded model once per session, tiny random models built offline."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub look-ups (and no 25 s of retries) in tests
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

import mhsa


@pytest.fixture(scope="session")
def minilm() -> mhsa.LoadedModel:
    return mhsa.load_model("default", device="cpu")


def _save_tiny(tmp_path_factory: pytest.TempPathFactory, name: str, model) -> str:
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    # Any tokenizer available offline will do: the embedded model's WordPiece tokenizer.
    AutoTokenizer.from_pretrained(mhsa.models.default_model_path()).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_gpt2_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=30522, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    return _save_tiny(tmp_path_factory, "gpt2", GPT2Model(config))


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
