# SPDX-License-Identifier: Apache-2.0
"""Real transformers models (built from configs, no hub): sharded save_pretrained read by
ckptio.load, and ckptio-written model.safetensors loaded by from_pretrained."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptio  # noqa: E402
import ckptio.safetensors as cst  # noqa: E402


def tiny_gpt2() -> object:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=300, n_positions=64)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def tiny_llama() -> object:
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama}


def saved_state(model: object) -> dict[str, torch.Tensor]:
    """The state dict without the tensors save_pretrained leaves out (tied to another)."""
    sd = model.state_dict()  # type: ignore[attr-defined]
    tied = set()
    seen: dict[tuple[int, int], str] = {}
    for k, v in sd.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset())
        if key in seen:
            tied.add(k)
        seen.setdefault(key, k)
    return {k: v for k, v in sd.items() if k not in tied}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_sharded_save_pretrained_read_by_ckptio(tmp_path: pathlib.Path, kind: str) -> None:
    model = MODELS[kind]()
    model.save_pretrained(tmp_path, max_shard_size="200KB")  # type: ignore[attr-defined]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    got = ckptio.load(tmp_path)
    want = saved_state(model)
    assert sorted(got) == sorted(index["weight_map"])
    assert set(got) <= set(model.state_dict())  # type: ignore[attr-defined]
    for k, v in got.items():
        assert isinstance(v, torch.Tensor) and v.dtype == want[k].dtype, k
        assert torch.equal(v, want[k]), k
    # The loaded dict is a state dict the model takes back.
    fresh = MODELS[kind]()
    fresh.load_state_dict(got, strict=False)  # type: ignore[attr-defined]
    for k, v in got.items():
        assert torch.equal(fresh.state_dict()[k], v)  # type: ignore[attr-defined]
    # keys= reads one layer only.
    layer = ckptio.load(tmp_path, keys=[next(k.rsplit(".", 2)[0] for k in got if ".1." in k)])
    assert layer and all(".1." in k for k in layer)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_ckptio_written_loaded_by_from_pretrained(tmp_path: pathlib.Path, kind: str) -> None:
    model = MODELS[kind]()
    model.config.save_pretrained(tmp_path)  # type: ignore[attr-defined]
    cst.save_file(saved_state(model), tmp_path / "model.safetensors", metadata={"format": "pt"})
    back = type(model).from_pretrained(tmp_path).eval()
    # Every weight comes back bit for bit (what ckptio answers for); the logits agree to bf16's
    # precision (transformers 5 rebuilds buffers such as llama's rotary frequencies itself in
    # from_pretrained, so its logits may differ in the last bits from the model built here).
    mine, theirs = saved_state(model), back.state_dict()  # type: ignore[attr-defined]
    for k, v in mine.items():
        assert torch.equal(theirs[k], v), k
    ids = torch.tensor([[1, 5, 7, 11, 42, 99, 3, 250]])
    with torch.no_grad():
        a = model(ids).logits  # type: ignore[operator]
        b = back(ids).logits
    assert a.dtype == b.dtype
    torch.testing.assert_close(a, b, atol=1e-2, rtol=1.6e-2)
    # And ckptio reads what transformers wrote in one file, bit for bit.
    model.save_pretrained(tmp_path / "hf")  # type: ignore[attr-defined]
    one = cst.load_file(tmp_path / "hf" / "model.safetensors")
    for k, v in saved_state(model).items():
        assert torch.equal(one[k], v), k
    np.testing.assert_array_equal(
        ckptio.load(tmp_path / "hf", framework="numpy", keys=[k])[k].view(np.uint8),
        one[k].view(torch.uint8).numpy(),
    )
