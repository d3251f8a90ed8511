"""Writes a tiny random-weight Qwen3 model for the real-vLLM end-to-end tests.

Usage: make_tiny_model.py TOKENIZER_DIR OUT_DIR

The weights are random (seeded, so every machine makes the same model) and the text it
generates is nonsense; what matters is that vLLM runs it like any Qwen3: the real Qwen3
tokenizer and chat template (copied from TOKENIZER_DIR), the same vocabulary, prefix caching,
KV events and NIXL transfers. 9.8 M parameters, about 39 MB, float32.
"""

import json
import pathlib
import shutil
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

SEED = 20261201


def main() -> None:
    tokenizer_dir, out_dir = map(pathlib.Path, sys.argv[1:3])
    torch.manual_seed(SEED)
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        torch_dtype="float32",
        bos_token_id=151643,
        eos_token_id=151645,
    )
    model = Qwen3ForCausalLM(config).to(torch.float32)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, tmp / name)
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 151643, "eos_token_id": [151645, 151643]})
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


if __name__ == "__main__":
    main()
