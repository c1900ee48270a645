"""CPU product paths chosen by timing on this host (issue 54): the choice per row count, its cache per
host, the override and its refusals, the few-row kernel's products and tokens, and the bf16 warning."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from twinserve.backends.real import few_rows, product_paths as pp
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.hardware import plan_bounds
from twinserve.core.errors import InvalidConfigError
from twinserve.core.sampling_params import SamplingParams

from .conftest import prompts_ids

CPU = torch.device("cpu")
TIMED = pp.TIMED_ROWS


@given(st.dictionaries(st.sampled_from(pp.PATHS), st.lists(st.floats(0.01, 100.0), min_size=TIMED, max_size=TIMED),
                       min_size=1))
def test_each_row_takes_a_path_within_the_tie_of_the_fastest(timings: dict[str, list[float]]) -> None:
    table = pp.choose(timings)
    assert len(table) == TIMED + 1
    smoothed = pp.smooth(timings)
    for i in range(TIMED):
        best = min(t[i] for t in smoothed.values())
        assert smoothed[table[i]][i] <= best * (1 + pp.TIE) + 1e-12
    # Above TIMED_ROWS rows (prefill) never the few-row kernel.
    assert table[-1] != "blocked"
    if set(timings) - {"blocked"}:
        assert table[-1] == min((p for p in timings if p != "blocked"), key=lambda p: timings[p][-1])


def test_one_noisy_cell_does_not_flip_a_row() -> None:
    timings = {"transposed": [1.0] * TIMED, "linear": [1.1] * TIMED}
    timings["linear"][6] = 0.7  # one run that met a quiet moment
    assert set(pp.choose(timings)[:TIMED]) == {"transposed"}


def test_the_fastest_path_wins_per_row_not_by_vendor() -> None:
    # The AVX2 EPYC: x @ W_t at 1 row, the prepacked weights from 5 rows, the kernel between.
    timings = {"transposed": [5.3, 10.0] + [30.0] * 14, "prepacked": [8.1] + [16.0 + 0.2 * r for r in range(15)],
               "blocked": [6.0 + 0.5 * r for r in range(16)]}
    table = pp.choose(timings)
    assert table[0] == "transposed" and set(table[1:12]) == {"blocked"} and table[-1] == "prepacked"
    assert set(table[12:16]) <= {"blocked", "prepacked"}
    # A row within TIE of the previous row's path keeps it (one regime bound fewer).
    assert pp.choose({"transposed": [1.0] + [1.02] * 15, "linear": [2.0] + [1.0] * 15})[1] == "transposed"
    assert pp.choose({"transposed": [1.0] + [1.2] * 15, "linear": [2.0] + [1.0] * 15})[1] == "linear"


def test_plan_bounds_are_where_the_path_changes() -> None:
    proj = ["transposed"] + ["blocked"] * 7 + ["linear"] * 8 + ["linear"]
    head = ["transposed"] * 2 + ["blocked"] * 14 + ["prepacked"]
    # 1 and 2: path changes; 8: blocked -> linear; 8 and 15: F.linear pads 9-15 rows to 16; 16: the
    # head's path above 16 rows.
    assert plan_bounds({"projections": proj, "head": head}) == [1, 2, 8, 15, 16]
    assert plan_bounds({"projections": ["blocked"] * 17, "head": ["blocked"] * 17}) == []


class _Cfg:
    hidden_size, q_size, kv_size, intermediate_size, vocab_size = 32, 32, 16, 48, 80


def _fake_timer(calls: list[str]):
    def time_paths(shapes, dtype, paths, rows=range(1, TIMED + 1), rounds=pp.ROUNDS):
        calls.append(str(shapes))
        return {p: [1.0 + i * (0.5 if p == "transposed" else 0.1) + (0.2 if p == "blocked" else 0.0)
                    for i in range(len(rows))] for p in paths}
    return time_paths


def test_the_choice_is_measured_once_and_cached_per_host(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TWINSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(few_rows, "load", lambda: (None, "needs a C++ compiler (test)"))
    calls: list[str] = []
    monkeypatch.setattr(pp, "time_paths", _fake_timer(calls))
    args = EngineArgs(dtype="float32")
    first = pp.resolve_plan(args, _Cfg(), CPU, torch.float32)
    assert first.source == "measured" and len(calls) == 2  # projections, then the head
    assert (tmp_path / pp.CACHE_FILE).exists()
    again = pp.resolve_plan(args, _Cfg(), CPU, torch.float32)
    assert again.source == "cache" and again.record() == first.record() and len(calls) == 2
    # Another torch (or CPU, or thread count) is another host: timed again.
    monkeypatch.setattr(torch, "__version__", "0.0-test")
    assert pp.resolve_plan(args, _Cfg(), CPU, torch.float32).source == "measured" and len(calls) == 4
    # The kernel that cannot build is left out cleanly: never chosen.
    assert "blocked" not in first.paths()


def test_an_explicit_small_batch_rows_pins_the_transposed_rows(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TWINSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(few_rows, "load", lambda: (None, "needs a C++ compiler (test)"))
    monkeypatch.setattr(pp, "time_paths", _fake_timer([]))
    plan = pp.resolve_plan(EngineArgs(dtype="float32", small_batch_rows=3), _Cfg(), CPU, torch.float32)
    assert plan.projections[:3] == ("transposed",) * 3 and "transposed" not in plan.projections[3:]
    assert plan.small_batch_rows() == 3
    over = pp.resolve_plan(EngineArgs(dtype="float32", small_batch_rows=2, cpu_product_paths="linear"),
                           _Cfg(), CPU, torch.float32)
    assert over.projections == ("transposed",) * 2 + ("linear",) * (TIMED - 1) and over.source == "override"


def test_an_override_this_cpu_cannot_run_is_a_startup_error_naming_it(monkeypatch) -> None:
    import twinserve.backends.real.models.llama as llama

    monkeypatch.setattr(llama, "packed_bf16_supported", lambda: False)
    with pytest.raises(InvalidConfigError) as e:
        pp.resolve_plan(EngineArgs(dtype="bfloat16", cpu_product_paths="prepacked"), _Cfg(), CPU, torch.bfloat16)
    msg = str(e.value)
    assert e.value.field == "cpu_product_paths" and "'prepacked' needs oneDNN's bf16 kernels" in msg
    assert "this CPU has" in msg and torch.backends.cpu.get_cpu_capability() in msg
    monkeypatch.setattr(few_rows, "load", lambda: (None, "needs a C++ compiler (none on PATH, CXX unset)"))
    with pytest.raises(InvalidConfigError, match="'blocked' needs the few-row kernel, which needs a C\\+\\+ compiler"):
        pp.resolve_plan(EngineArgs(dtype="float32", cpu_product_paths="blocked"), _Cfg(), CPU, torch.float32)
    with pytest.raises(InvalidConfigError, match="'transposed' needs small_batch_weights"):
        pp.resolve_plan(EngineArgs(dtype="float32", cpu_product_paths="transposed", small_batch_weights=False),
                        _Cfg(), CPU, torch.float32)
    with pytest.raises(InvalidConfigError, match="cpu_product_paths"):
        EngineArgs(cpu_product_paths="fastest")


def test_without_a_compiler_the_kernel_says_why(monkeypatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(few_rows.shutil, "which", lambda name: None)
    assert "C++ compiler" in few_rows.unavailable_reason()
    monkeypatch.setattr(few_rows, "cpu_flags", lambda: {"sse2"})
    assert "lacks avx2, fma" in few_rows.unavailable_reason()


def _kernel():
    why = few_rows.unavailable_reason()
    if why is not None:
        pytest.skip(f"the few-row kernel needs {why}")  # only where it cannot build; then auto never picks it
    module, err = few_rows.load()
    assert module is not None, err  # this host can build it: a failed build is a failure
    return module


@pytest.mark.timeout(120)
def test_a_built_kernel_loads_past_a_lock_a_killed_build_left(tmp_path, monkeypatch) -> None:
    import shutil

    _kernel()
    built = next(few_rows._build_dir().glob("twinserve_few_rows*.so"))
    monkeypatch.setenv("TWINSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(few_rows.BUILD_ENV, "0")  # never compile here: the copy must load as it is
    dest = few_rows._build_dir()
    dest.mkdir(parents=True)
    shutil.copy(built, dest / built.name)
    (dest / "lock").touch()  # cpp_extension would wait for this file to go, for ever
    few_rows.load.cache_clear()
    try:
        module, err = few_rows.load()
        assert module is not None, err
        x = torch.randn(3, 8)
        w = torch.randn(5, 8)
        torch.testing.assert_close(module.mm(x, module.pack(w), 5), x @ w.t(), rtol=1e-5, atol=1e-4)
    finally:
        few_rows.load.cache_clear()


def test_only_a_stale_build_lock_is_removed(tmp_path) -> None:
    import os
    import time

    lock = tmp_path / "lock"
    lock.touch()
    assert not few_rows.clear_stale_lock(tmp_path) and lock.exists()  # a build may be running
    old = time.time() - few_rows.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    assert few_rows.clear_stale_lock(tmp_path) and not lock.exists()
    assert not few_rows.clear_stale_lock(tmp_path)


@pytest.mark.parametrize("out_features, in_features", [(16, 8), (37, 33), (96, 576), (5, 1)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 16, 64])
def test_the_kernel_multiplies_as_a_plain_product(out_features: int, in_features: int, rows: int) -> None:
    mod = _kernel()
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    w, x = torch.randn(out_features, in_features, generator=g), torch.randn(rows, in_features, generator=g)
    got = mod.mm(x, mod.pack(w), out_features)
    assert got.shape == (rows, out_features)
    torch.testing.assert_close(got, x @ w.t(), rtol=1e-5, atol=1e-4)


def test_each_path_decodes_the_tokens_of_plain_products(make_llm) -> None:
    """Twelve sequences, then fewer as they finish: every row count 1..12 and the prefill through each path."""
    _kernel()
    prompts = [{"prompt_token_ids": p} for p in prompts_ids(12, seed=11, lo=6, hi=20)]
    params = [SamplingParams(temperature=0.0, max_tokens=3 + i % 6, ignore_eos=True) for i in range(12)]
    tokens = {}
    for path in ("linear", "blocked", "transposed", "prepacked", "auto"):
        llm = make_llm(dtype="float32", max_num_seqs=16, cpu_product_paths=path)
        plan = llm.llm_engine.worker.product_plan
        assert path == "auto" or set(plan.projections[:TIMED]) == {path}
        tokens[path] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert all(t == tokens["linear"] for t in tokens.values())


def test_dtype_auto_is_fp32_and_explicit_bf16_warns_with_the_timed_slowdown(make_llm, monkeypatch, caplog) -> None:
    import twinserve.backends.real.models.llama as llama

    assert EngineArgs(dtype="auto").resolve_dtype(CPU) == torch.float32
    monkeypatch.setattr(llama, "packed_bf16_supported", lambda: False)
    monkeypatch.setattr(pp, "bf16_slowdown", lambda cfg, rows=(1, 8): {1: 4.2, 8: 2.5})
    with caplog.at_level(logging.WARNING, logger="twinserve.backends.real.product_paths"):
        make_llm(dtype="bfloat16")
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "bf16 on a CPU without bf16 kernels" in msg and "4.2x at 1 row, 2.5x at 8 rows" in msg
    assert "this CPU has" in msg and "--dtype auto (float32)" in msg
    caplog.clear()
    monkeypatch.setattr(llama, "packed_bf16_supported", lambda: True)
    with caplog.at_level(logging.WARNING, logger="twinserve.backends.real.product_paths"):
        assert pp.warn_slow_bf16(_Cfg()) is None
    assert not caplog.records  # a CPU with the kernels: no warning
