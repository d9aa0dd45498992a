"""``freetoken serve --moe-backend hybrid`` end to end: a chat request, the live resize and
``/metrics`` over HTTP, and a SIGTERM shutdown that still writes ``--record-routing``."""

from __future__ import annotations

import json
import signal

import httpx
import numpy as np

from tests.clients.server import ServerProcess


def test_hybrid_server_resizes_reports_and_records(tmp_path):
    record = tmp_path / "routing.npz"
    server = ServerProcess.start(
        tmp_path / "serve.log", max_output_tokens=16,
        extra_args=("--moe-backend", "hybrid", "--moe-cache-slots", "0.25",
                    "--record-routing", str(record)))
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            r = http.post("/v1/chat/completions", json={
                "model": "m", "max_tokens": 12, "temperature": 0,
                "messages": [{"role": "user", "content": "hello"}]})
            assert r.status_code == 200
            memory = http.get("/v1/freetoken/memory").json()
            assert memory["backend"] == "hybrid" and memory["expert_cache"]["slots"] == 16
            slot = memory["expert_cache"]["slot_bytes"]
            r = http.post("/v1/freetoken/memory", json={"expert_cache": f"{3 * slot}B"})
            assert r.json()["expert_cache"] == {"old_slots": 16, "slots": 3, "slot_bytes": slot,
                                                "bytes": 3 * slot, "kept": 3}
            metrics = http.get("/metrics").text
            assert "freetoken_moe_cache_slots 3\n" in metrics
            hits = sum(float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith("freetoken_moe_hits_total{"))
            misses = sum(float(line.split()[-1]) for line in metrics.splitlines()
                         if line.startswith("freetoken_moe_misses_total{"))
            assert hits + misses > 0
    finally:
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(30)
    log = server.log_tail()
    assert code == 0, log
    assert "[freetoken] stopped" in log
    z = np.load(record)
    assert z["topk_ids"].shape[1:] == (4, 4)  # tiny qwen3_next: 4 MoE layers, top-4
    assert z["topk_ids"].shape[0] >= 12
    assert json.loads(str(z["meta"]))["source"] == "freetoken --record-routing"
