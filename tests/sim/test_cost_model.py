"""Cost models, catalogs, KV capacity and the single-request exactness check."""

from __future__ import annotations

import dataclasses
import json

import pytest

from twinserve.backends.sim import (FittedCostModel, ProfileError, RooflineCostModel, fit_profile,
                                    get_hardware, get_model, kv_capacity)
from twinserve.backends.sim.catalog import UnknownSpecError
from twinserve.core.errors import InvalidConfigError
from twinserve.sim.build import build

from .helpers import small_config


def test_catalog_parameter_counts_match_published_sizes() -> None:
    assert get_model("Llama-2-7B").num_params == pytest.approx(6.74e9, rel=0.01)
    assert get_model("llama-2-70b").num_params == pytest.approx(68.98e9, rel=0.01)
    assert get_model("SmolLM2-135M").num_params == pytest.approx(134.5e6, rel=0.01)
    assert get_model("SmolLM2-135M").kv_bytes_per_token == 23_040  # bf16, FACTS.md
    with pytest.raises(UnknownSpecError, match="Llama-2-7B"):
        get_model("gpt-5")


def test_kv_capacity_formula_and_override() -> None:
    m, h = get_model("Llama-2-7B"), get_hardware("A100-80GB")
    cap = kv_capacity(m, h, 1, 16, 0.9, activation_reserve=2 * 2**30)
    reserve = 0.5 * 2**30 + 0.5 * 2**30  # CUDA context + CUDA graphs (no NCCL at TP 1)
    expected = ((h.mem_bytes * 0.9 - m.weight_bytes - 2 * 2**30 - reserve)
                // (16 * m.kv_bytes_per_token))
    assert cap.num_blocks == expected
    assert kv_capacity(m, h, 1, 16, num_blocks_override=77).num_blocks == 77
    # Tensor parallelism splits weights and KV heads: more than twice the blocks at TP 2.
    assert kv_capacity(m, h, 2, 16).num_blocks > 2 * kv_capacity(m, h, 1, 16).num_blocks


def test_trtllm_takes_its_share_of_the_memory_left_after_the_weights() -> None:
    # TensorRT-LLM's free_gpu_memory_fraction: 0.9 of what is free once loaded, not 0.9 of the GPU.
    m, h = get_model("Llama-2-7B"), get_hardware("A100-80GB")
    taken = m.weight_bytes + 2 * 2**30 + 2**30  # weights, activations, CUDA context + graphs (TP 1)
    free = kv_capacity(m, h, 1, 16, 0.9, activation_reserve=2 * 2**30, memory_basis="free")
    assert free.num_blocks == (h.mem_bytes - taken) * 0.9 // (16 * m.kv_bytes_per_token)
    total = kv_capacity(m, h, 1, 16, 0.9, activation_reserve=2 * 2**30)
    assert free.num_blocks > total.num_blocks  # 0.1 x the weights more room
    with pytest.raises(InvalidConfigError, match="kv_memory_basis"):
        kv_capacity(m, h, 1, 16, memory_basis="spare")


def test_roofline_terms_respond_to_features() -> None:
    roof = RooflineCostModel(get_model("Llama-2-7B"), get_hardware("A100-80GB"))
    base = roof.step_time(0, 0, 0, 0.0, 8, 8 * 1000)
    assert roof.step_time(0, 0, 0, 0.0, 8, 8 * 3000) > base  # decode: longer context costs more
    assert roof.step_time(0, 0, 0, 0.0, 64, 64 * 1000) > base  # more sequences cost more
    chunk = roof.step_time(512, 1, 0, 512 * 256.0, 0, 0)
    assert roof.step_time(512, 1, 3000, 512 * (3000 + 256.0), 0, 0) > chunk  # cached context
    tp4 = RooflineCostModel(get_model("Llama-2-70B"), get_hardware("A100-80GB"), tp=4)
    tp8 = RooflineCostModel(get_model("Llama-2-70B"), get_hardware("A100-80GB"), tp=8)
    assert tp8.step_time(2048, 2, 0, 2048 * 512.0, 0, 0) < tp4.step_time(2048, 2, 0, 2048 * 512.0, 0, 0)


def test_single_request_reproduces_cost_model_exactly() -> None:
    for ff in (True, False):
        cfg = small_config(num_requests=1, prompt_dist="fixed", prompt_mean=1000,
                           output_dist="fixed", output_mean=40, max_num_batched_tokens=512,
                           fast_forward=ff)
        built = build(cfg)
        res = built.simulation.run()
        rec = res.records[0]
        cost = built.cost_model.step_time
        # Two prefill chunks (512, then 488 attending to 512 cached), then 39 decodes.
        prefill = cost(512, 1, 0, 512 * (0 + 256.0), 0, 0)
        prefill2 = cost(488, 1, 512, 488 * (512 + 244.0), 0, 0)
        t = rec.arrival_time + prefill
        t = t + prefill2
        assert rec.first_token_time - rec.arrival_time == t - rec.arrival_time
        expected = [t]
        for i in range(39):
            t = t + cost(0, 0, 0, 0.0, 1, 1000 + i)
            expected.append(t)
        assert rec.token_times == expected
        assert rec.finish_time == expected[-1]
        assert rec.num_output_tokens == 40


def test_fitted_profile_roundtrip_fit_and_errors(tmp_path) -> None:
    true = FittedCostModel(2e-3, 1e-6, 5e-5, 2e-11, 0.0, 1.5e-5, 3e-9)
    rows = []
    for i in range(40):
        f = (i * 37 % 900, i % 3, i * 101 % 4000, float(i * 1234 % 100000), i % 20, i * 997 % 30000)
        rows.append(dict(zip(("num_prefill_tokens", "num_prefill_seqs", "prefill_context",
                              "prefill_attn", "num_decode_seqs", "decode_context"), f),
                         step_time_s=true.step_time(*f)))
    fitted = fit_profile(rows, model="Llama-2-7B")
    for row in rows:
        args = [row[k] for k in ("num_prefill_tokens", "num_prefill_seqs", "prefill_context",
                                 "prefill_attn", "num_decode_seqs", "decode_context")]
        assert fitted.step_time(*args) == pytest.approx(row["step_time_s"], rel=1e-6)
    path = tmp_path / "profile.json"
    fitted.save(path)
    again = FittedCostModel.load(path)
    assert again.per_decode_seq_s == fitted.per_decode_seq_s
    assert json.loads(path.read_text())["format"] == "twinserve-step-profile/4"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"coefficients": {"per_tokn_s": 1.0}}))
    with pytest.raises(ProfileError, match=r"bad\.json.*per_tokn_s"):
        FittedCostModel.load(bad)
    bad.write_text('{"coefficients": {\n "per_token_s": }')
    with pytest.raises(ProfileError, match=r"bad\.json:2"):
        FittedCostModel.load(bad)


def test_fitted_cost_model_drives_a_run(tmp_path) -> None:
    path = tmp_path / "p.json"
    FittedCostModel(intercept_s=0.01, per_decode_seq_s=0.001).save(path)
    cfg = small_config(num_requests=1, prompt_dist="fixed", prompt_mean=100, output_dist="fixed",
                       output_mean=5, cost_model="fitted", profile=str(path))
    rec = build(cfg).simulation.run().records[0]
    gaps = [b - a for a, b in zip(rec.token_times, rec.token_times[1:])]
    assert gaps == pytest.approx([0.011] * 4)
    assert rec.first_token_time - rec.arrival_time == pytest.approx(0.01)


def test_steps_after_an_idle_gap_cost_the_profiles_wake_time(tmp_path) -> None:
    """A request that finds the engine idle pays the wake's extra seconds on its first steps,
    interpolated in the gap and scaled with the machine; stepping and fast-forward agree; the
    table survives the profile file; a /3 profile's factors still price as factors."""
    from .helpers import fingerprint, run

    def flat(pairs: list[tuple[float, float]]) -> list[float]:
        return [x for pair in pairs for x in pair]

    prof = FittedCostModel(intercept_s=0.01, per_decode_seq_s=0.001, wake_idle_s=(1.0, 3.0),
                           wake_extra_s=((0.005, 0.002), (0.01, 0.005)))
    assert prof.wake_after(0.0) == []
    assert flat(prof.wake_after(0.5)) == pytest.approx([1.0, 0.0025, 1.0, 0.001])
    assert flat(prof.wake_after(2.0)) == pytest.approx([1.0, 0.0075, 1.0, 0.0035])
    assert flat(prof.wake_after(9.0)) == pytest.approx([1.0, 0.01, 1.0, 0.005])
    # On a machine measured 20% slower the extra time is 20% longer too.
    assert flat(dataclasses.replace(prof, time_scale=1.2).wake_after(9.0)) == pytest.approx([1.0, 0.012,
                                                                                             1.0, 0.006])
    path = tmp_path / "p.json"
    prof.save(path)
    assert json.loads(path.read_text())["wake"] == {"idle_s": [1.0, 3.0],
                                                     "extra_s": [[0.005, 0.002], [0.01, 0.005]]}
    assert flat(FittedCostModel.load(path).wake_after(2.0)) == pytest.approx([1.0, 0.0075, 1.0, 0.0035])
    fields = dict(num_requests=6, arrival="fixed", rate=0.5, prompt_dist="fixed", prompt_mean=100,
                  output_dist="fixed", output_mean=5, cost_model="fitted", profile=str(path))
    results = [run(small_config(fast_forward=ff, **fields)) for ff in (False, True)]
    assert fingerprint(results[0]) == fingerprint(results[1])
    recs = sorted(results[0].records, key=lambda r: r.arrival_time)
    woken = 0
    for prev, rec in zip(recs, recs[1:]):
        (_, e0), (_, e1) = prof.wake_after(rec.arrival_time - prev.finish_time)
        assert e0 > 0.007
        assert rec.first_token_time - rec.arrival_time == pytest.approx(0.01 + e0)
        gaps = [b - a for a, b in zip(rec.token_times, rec.token_times[1:])]
        assert gaps == pytest.approx([0.011 + e1, 0.011, 0.011, 0.011])
        woken += 1
    assert woken == 5
    # A profile of format /3 carries factors: the steps cost that many times the model.
    old = {**json.loads(path.read_text()), "format": "twinserve-step-profile/3",
           "wake": {"idle_s": [1.0, 3.0], "factors": [[1.5, 1.2], [2.0, 1.5]]}}
    path.write_text(json.dumps(old))
    loaded = FittedCostModel.load(path)
    assert flat(loaded.wake_after(2.0)) == pytest.approx([1.75, 0.0, 1.35, 0.0])
    prev, rec = sorted(run(small_config(**fields)).records, key=lambda r: r.arrival_time)[2:4]
    (f0, _), _ = loaded.wake_after(rec.arrival_time - prev.finish_time)
    assert f0 > 1.7 and rec.first_token_time - rec.arrival_time == pytest.approx(0.01 * f0)
    data = json.loads(path.read_text())
    # A malformed wake table is refused, naming the field.
    data = json.loads(path.read_text())
    for wake in ({"idle_s": [3.0, 1.0], "factors": [[1.0], [1.0]]}, {"idle_s": [1.0], "factors": [[]]},
                 {"idle_s": [1.0], "factors": [[1.2]], "extra": 1}, [1.0], {"idle_s": [1.0], "extra_s": [[-0.1]]},
                 {"idle_s": [1.0], "extra_s": [[0.1]], "factors": [[1.2]]}):
        data["wake"] = wake
        path.write_text(json.dumps(data))
        with pytest.raises(ProfileError, match="'wake'"):
            FittedCostModel.load(path)


def test_steps_beyond_the_profiles_fitted_shapes_are_counted_stepping_or_skipping(tmp_path: Path) -> None:
    from twinserve.backends.sim.executor import SimExecutor
    from twinserve.sim.study import run_point

    # A profile fitted on steps of up to 4 decodes at 300 tokens of context each (and small
    # prefills); the workload's requests decode past that context, 6 at a time.
    top = {"num_prefill_tokens": 512.0, "num_prefill_seqs": 4.0, "prefill_context": 512.0,
           "prefill_attn": 1e6, "num_decode_seqs": 4.0, "decode_context": 1200.0, "num_tokens": 512.0,
           "decode_context_per_seq": 300.0}
    prof = FittedCostModel(intercept_s=0.01, per_token_s=1e-4, per_decode_seq_s=1e-3,
                           per_decode_context_token_s=1e-6, meta={"fit": {"range": top}})
    path = tmp_path / "p.json"
    prof.save(path)
    fields = dict(num_requests=12, arrival="poisson", rate=2.0, prompt_dist="uniform", prompt_min=100,
                  prompt_max=250, output_dist="uniform", output_min=20, output_max=120, cost_model="fitted",
                  profile=str(path), max_num_batched_tokens=512)

    # Every step the executor prices, by hand: which lie beyond the range, and their time.
    seen: list[tuple[tuple, float]] = []

    class Recording:
        name = "recording"
        shape_range = prof.shape_range

        def step_time(self, *f):
            t = prof.step_time(*f)
            seen.append((f, t))
            return t

    from twinserve.sim.build import build

    built = build(small_config(fast_forward=False, **fields))
    ex = built.simulation.executor
    ex.__init__(Recording())
    built.simulation.run()
    beyond = [(f, t) for f, t in seen if prof.beyond_range(*f)]
    assert 0 < len(beyond) < len(seen)
    assert ex.totals.beyond_fit_steps == len(beyond)
    assert ex.totals.beyond_fit_time == pytest.approx(sum(t for _, t in beyond))
    # Fast-forwarded decode windows count the same steps.
    for ff in (False, True):
        b = build(small_config(fast_forward=ff, **fields))
        assert (b.simulation.run().num_ff_windows > 0) == ff
        tot = b.simulation.executor.totals
        assert tot.beyond_fit_steps == len(beyond)
        assert tot.beyond_fit_time == pytest.approx(ex.totals.beyond_fit_time, rel=1e-9)
    # The study row carries the shares; a cost model without a range carries none.
    row = run_point(small_config(**fields)).row
    assert row["steps_beyond_fit"] == pytest.approx(len(beyond) / len(seen))
    assert row["busy_beyond_fit"] == pytest.approx(sum(t for _, t in beyond) / sum(t for _, t in seen))
    plain = run_point(small_config(num_requests=5))
    assert "busy_beyond_fit" not in plain.row
    # The study's notes say so when a point extrapolated, and only then.
    from twinserve.sim.cli import beyond_fit_note

    (note,) = beyond_fit_note([run_point(small_config(**fields)), plain])
    assert note.startswith(f"extrapolated: in 1 of 2 point(s) the profile priced up to {row['busy_beyond_fit']:.0%}")
    assert beyond_fit_note([plain]) == []
    assert SimExecutor(FittedCostModel(intercept_s=0.01)).fit_range_max is None
