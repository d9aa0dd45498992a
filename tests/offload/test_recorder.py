"""RoutingRecorder: chunked prefill + decode rows land in the routing-trace format replay reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from evals.replay_routing import load_trace
from freetoken.offload.recorder import RoutingRecorder

L, E, K = 3, 8, 2


def _ids(t: int, layer: int, base: int) -> torch.Tensor:
    """Distinct, predictable [t, K] ids: row r of layer l -> (base + r + l, base + r + l + 1) % E."""
    r = torch.arange(t)[:, None] + base + layer
    return (torch.cat([r, r + 1], dim=1) % E).to(torch.int64)


def test_chunked_prefill_and_decode_round_trip(tmp_path):
    rec = RoutingRecorder(tmp_path / "sub" / "trace.npz", num_layers=L, num_experts=E, top_k=K,
                          model="tiny")
    rec.begin_step(seq_id=7, phase=0)
    for base, t in ((0, 3), (3, 2)):  # one forward, two internal chunks of 3 and 2 tokens
        for layer in range(L):
            rec.record(layer, _ids(t, layer, base))
    for step in range(2):
        rec.begin_step(seq_id=7, phase=1)
        for layer in range(L):
            rec.record(layer, _ids(1, layer, 5 + step))
    rec.begin_step(seq_id=9, phase=0)
    for layer in range(L):
        rec.record(layer, _ids(2, layer, 4))
    path = rec.save()

    expected = np.concatenate(
        [torch.stack([_ids(t, layer, b) for layer in range(L)], dim=1).numpy()
         for b, t in ((0, 3), (3, 2), (5, 1), (6, 1), (4, 2))]
    )
    with np.load(path) as z:
        assert z["topk_ids"].dtype == np.int16
        np.testing.assert_array_equal(z["topk_ids"], expected)
        np.testing.assert_array_equal(z["token_phase"], [0, 0, 0, 0, 0, 1, 1, 0, 0])
        np.testing.assert_array_equal(z["seq_id"], [7] * 7 + [9] * 2)
        np.testing.assert_array_equal(z["step_id"], [0] * 5 + [1, 2] + [3] * 2)
        meta = json.loads(str(z["meta"]))
    assert meta == {"model": "tiny", "num_experts": E, "top_k": K, "num_layers": L,
                    "phase": "mixed", "source": "freetoken --record-routing",
                    "license": "generated"}

    ids, meta2, step_rows, decode, mode = load_trace(path)
    assert mode == "pf+dec" and meta2["num_experts"] == E
    assert [r.tolist() for r in step_rows] == [[0, 1, 2, 3, 4], [5], [6], [7, 8]]
    assert decode == [False, True, True, False]
    assert rec.num_tokens == 9


def test_repeated_save_mid_forward_and_missing_layers(tmp_path):
    rec = RoutingRecorder(tmp_path / "t.npz", num_layers=L, num_experts=E, top_k=K, model="m")
    rec.begin_step(0, 1)
    rec.record(0, _ids(1, 0, 0))
    rec.save()  # mid-forward: the unfinished chunk is not written yet
    with np.load(tmp_path / "t.npz") as z:
        assert z["topk_ids"].shape == (0, L, K)
        assert json.loads(str(z["meta"]))["phase"] == "decode"
    rec.record(1, _ids(1, 1, 0))
    rec.begin_step(0, 1)  # layer 2 never came: its ids are written as -1
    for layer in range(L):
        rec.record(layer, _ids(1, layer, 1))
    rec.save()
    rec.close()
    assert not list(tmp_path.glob(".*tmp"))
    with np.load(tmp_path / "t.npz") as z:
        ids = z["topk_ids"]
    assert ids.shape == (2, L, K)
    np.testing.assert_array_equal(ids[0, 2], [-1, -1])
    np.testing.assert_array_equal(ids[1, 2], _ids(1, 2, 1)[0].numpy())


def test_bad_calls_raise(tmp_path):
    rec = RoutingRecorder(tmp_path / "t.npz", num_layers=L, num_experts=E, top_k=K, model="m")
    with pytest.raises(RuntimeError, match="begin_step"):
        rec.record(0, _ids(1, 0, 0))
    rec.begin_step(0, 0)
    with pytest.raises(ValueError, match="layer 3"):
        rec.record(3, _ids(1, 0, 0))
    with pytest.raises(ValueError, match=r"\[T, 2\]"):
        rec.record(0, torch.zeros(2, 3, dtype=torch.int64))
    rec.record(0, _ids(2, 0, 0))
    with pytest.raises(ValueError, match="routed 1 tokens"):
        rec.record(1, _ids(1, 1, 0))
    with pytest.raises(ValueError, match="phase"):
        rec.begin_step(0, 2)
    with pytest.raises(ValueError, match="int16"):
        RoutingRecorder(tmp_path / "x.npz", num_layers=1, num_experts=40000, top_k=1, model="m")
