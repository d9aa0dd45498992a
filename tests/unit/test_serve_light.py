"""The start of ``freetoken serve`` is torch-free on a CPU device: its command line, flag checks
and loading server import without torch (so ``/health`` answers before the seconds torch takes),
and the settings' torch-free copies agree with the modules that own them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from freetoken.launch import device_type
from tests.clients.server import REPO_ROOT

START_PATH = """
import sys
from freetoken.cli import build_parser
from freetoken.launch import check_moe_flags, memory_plan, resolve_model, serve
from freetoken.server.loading import LoadingApp
from freetoken.engine.context_limit import check_max_model_len
from freetoken.packed.manifest import read_manifest
import uvicorn
args = build_parser("serve").parse_args(["serve", "--moe-backend", "cpu", "--moe-cache-slots",
                                         "0.5", "--moe-memory-floor", "1GiB"])
args.model = resolve_model(None)  # the embedded model, generated already
check_moe_flags(args)
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_the_serve_start_path_imports_no_torch() -> None:
    from freetoken.models.tiny import default_model_path

    default_model_path()  # generated here if missing: generating it takes torch
    out = subprocess.run([sys.executable, "-c", START_PATH], cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True)
    assert out.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize(("text", "kind"), [("cpu", "cpu"), ("cpu:0", "cpu"), ("cuda", "cuda"),
                                            ("cuda:1", "cuda")])
def test_device_type_reads_cpu_and_cuda(text, kind) -> None:
    assert device_type(text) == kind


@pytest.mark.parametrize("text", ["", "meta", "cuda:", "cuda:x", "gpu", " cpu"])
def test_device_type_refuses_anything_else(text) -> None:
    with pytest.raises(ValueError) as info:
        device_type(text)
    assert str(info.value) == f"--device must be cpu or cuda[:i], got {text!r}"


def test_torch_free_settings_match_their_owners() -> None:
    from freetoken.offload import moe_config
    from freetoken.ops.cpu_moe import ACTIVATIONS

    assert moe_config.CPU_ACTIVATIONS == ACTIVATIONS
