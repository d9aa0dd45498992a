"""FreeToken vs transformers (the reference implementation) on the tiny checkpoints, fp32."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from freetoken.models.registry import load_model
from freetoken.models.tiny import make_tiny
from freetoken.models.tiny_tokens import end_of_turn
from freetoken.tokenizer.tokenizer import Tokenizer
from tests.models.conftest import load_hf, prompt_ids

PROMPT_LEN = 64
NEW_TOKENS = 32
TOL = 1e-4


@pytest.fixture(scope="module")
def pair(arch, tiny_checkpoint):
    path = tiny_checkpoint(arch)
    hf = load_hf(path)
    hf.generation_config.eos_token_id = None  # generate exactly NEW_TOKENS tokens
    return path, load_model(path), hf


def test_prefill_logits_match_transformers(pair) -> None:
    path, ft, hf = pair
    ids = prompt_ids(path, PROMPT_LEN)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    out = ft(ids, ft.new_state(), all_logits=True)
    assert out.dtype == torch.float32 and out.shape == ref.shape == (PROMPT_LEN, ft.config.vocab_size)
    assert (out - ref).abs().max().item() <= TOL
    last = ft(ids, ft.new_state())
    assert last.shape == (1, ft.config.vocab_size)
    assert (last[0] - ref[-1]).abs().max().item() <= TOL


def test_greedy_decode_matches_transformers_generate(pair) -> None:
    """32 greedy tokens equal ``generate``'s; the calibrated end-of-turn token is suppressed in
    both (with random weights it is the argmax of most steps once it appears, GLM's from the
    first)."""
    path, ft, hf = pair
    ids = prompt_ids(path, PROMPT_LEN)
    end = Tokenizer.from_pretrained(path).token_to_id(end_of_turn(ft.config.model_type))
    config = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                              suppress_tokens=[end])
    with torch.no_grad():
        ref = hf.generate(ids[None], generation_config=config,
                          attention_mask=torch.ones(1, PROMPT_LEN, dtype=torch.long))[0, PROMPT_LEN:]
    state = ft.new_state()
    logits = ft(ids, state)
    tokens, step_logits = [], []
    for _ in range(NEW_TOKENS):
        token = logits.index_fill(-1, torch.tensor([end]), float("-inf")).argmax(-1)
        tokens.append(int(token))
        step_logits.append(logits[0])
        logits = ft(token, state)
    assert tokens == ref.tolist()
    assert len(set(tokens)) > 1
    assert state.num_tokens == PROMPT_LEN + NEW_TOKENS
    # every incremental decode step also matches a one-shot transformers forward of the sequence
    full = torch.cat([ids, torch.tensor(tokens)])
    with torch.no_grad():
        ref_logits = hf(full[None]).logits[0, PROMPT_LEN - 1 : -1]
    assert (torch.stack(step_logits) - ref_logits).abs().max().item() <= TOL


@pytest.mark.parametrize("arch_name, overrides", [
    ("qwen3_moe", {"mlp_only_layers": [1], "num_hidden_layers": 2}),
    ("qwen3_next", {"mlp_only_layers": [0], "decoder_sparse_step": 2}),
])
def test_dense_mlp_layers_match_transformers(arch_name, overrides, tmp_path) -> None:
    path = make_tiny(arch_name, "tiny", tmp_path / arch_name, config_overrides=overrides)
    ft = load_model(path)
    assert [ft.config.is_moe_layer(i) for i in range(ft.config.num_hidden_layers)] == (
        [True, False] if arch_name == "qwen3_moe" else [False, True, False, True]
    )
    ids = prompt_ids(path, PROMPT_LEN)
    with torch.no_grad():
        ref = load_hf(path)(ids[None]).logits[0]
    assert (ft(ids, ft.new_state(), all_logits=True) - ref).abs().max().item() <= TOL


def test_tied_embeddings_match_transformers(tiny_checkpoint, tmp_path) -> None:
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    src = tiny_checkpoint("qwen3_moe")
    path = tmp_path / "tied"
    shutil.copytree(src, path)
    tensors = load_file(src / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=True)))
    ft = load_model(path)
    assert ft.lm_head is ft.embed and "lm_head.weight" not in ft.weight_targets()
    ids = prompt_ids(path, PROMPT_LEN)
    with torch.no_grad():
        ref = load_hf(path)(ids[None]).logits[0]
    assert (ft(ids, ft.new_state(), all_logits=True) - ref).abs().max().item() <= TOL
