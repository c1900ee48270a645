"""The simulated cluster: one replica == the single-engine simulator, routing, per-replica metrics."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from twinserve.sim import cli
from twinserve.sim.cluster_study import simulate_cluster
from twinserve.sim.config import from_dict
from twinserve.sim.errors import ConfigError
from twinserve.sim.study import run_point

from .helpers import fingerprint, run, small_config
from .test_world import FF_CASES

IDENTITY_CASES = ("plain", "preemption", "shared_prefix", "multi_turn", "max_model_len_stop")


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("case", IDENTITY_CASES)
def test_one_replica_cluster_is_the_single_engine_simulator(case: str, fast_forward: bool) -> None:
    fields = dict(FF_CASES[case], fast_forward=fast_forward)
    single = run(small_config(**fields))
    router = "prefix_affinity" if fast_forward else "round_robin"
    _, res = simulate_cluster(small_config(router=router, **fields))
    assert fingerprint(res.replicas[0]) == fingerprint(single)
    assert [dataclasses.astuple(r) for r in res.total.records] == \
        [dataclasses.astuple(r) for r in single.records]
    assert res.total.end_time == single.end_time


# A shared-system-prompt, multi-turn chat workload: 32 system prompts of 2,000 tokens,
# three turns per conversation, on four replicas whose KV pools cannot all hold every
# system prompt and conversation.
CHAT = dict(num_replicas=4, num_system_prompts=32, system_prompt_len=2000, turns=3,
            think_time=3.0, followup_tokens=200, num_requests=240, prompt_dist="uniform",
            prompt_min=2050, prompt_max=2400, output_dist="uniform", output_min=50,
            output_max=250, max_model_len=4096, rate=2.0, num_gpu_blocks=1500)


def test_prefix_affinity_beats_round_robin_on_shared_prompt_chat() -> None:
    rows = {r: run_point(small_config(router=r, **CHAT)).row
            for r in ("round_robin", "prefix_affinity")}
    rr, pa = rows["round_robin"], rows["prefix_affinity"]
    assert rr["completed"] == pa["completed"] == rr["num_requests"] == 720
    assert pa["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.15
    assert pa["mean_ttft_s"] < 0.9 * rr["mean_ttft_s"]
    assert pa["p50_ttft_s"] < 0.5 * rr["p50_ttft_s"]
    # The bounded-load rule keeps the busiest replica near the mean.
    assert pa["load_imbalance"] <= 1.3 and pa["router_spills"] > 0


def test_cluster_fast_forward_equals_stepping_with_follow_up_turns() -> None:
    fields = dict(CHAT, num_replicas=3, num_requests=60, rate=3.0, think_time=0.5,
                  router="session_affinity")
    _, stepped = simulate_cluster(small_config(fast_forward=False, **fields))
    _, skipped = simulate_cluster(small_config(fast_forward=True, **fields))
    assert skipped.total.num_ff_windows > 0
    for a, b in zip(stepped.replicas, skipped.replicas):
        assert fingerprint(a) == fingerprint(b)


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv",
                                    "power_of_two", "session_affinity"])
def test_every_request_is_routed_once_and_served(router: str) -> None:
    cfg = small_config(num_replicas=3, router=router, turns=2, think_time=1.0, rate=9.0,
                       num_requests=90)
    point = run_point(cfg)
    req, per = point.requests, point.replicas
    assert per is not None and len(per) == 3
    assert req["request_id"].is_unique and point.row["completed"] == len(req)
    assert per["routed"].sum() == len(req)
    assert list(per["completed"]) == list(req.groupby("replica").size().reindex(range(3),
                                                                                 fill_value=0))
    assert (per["routed"] > 0).all()
    if router == "session_affinity":
        assert (req.groupby("conversation")["replica"].nunique() == 1).all()


def test_heterogeneous_replicas_from_toml(tmp_path) -> None:
    text = ('[engine]\nmodel = "Llama-2-7B"\nhardware = "A100-80GB"\n'
            '[workload]\nnum_requests = 200\nrate = 14.0\n'
            '[cluster]\nnum_replicas = 2\nrouter = "least_outstanding"\n'
            'replicas = [{hardware = "H100-SXM"}, {}]\n')
    f = tmp_path / "c.toml"
    f.write_text(text)
    out = tmp_path / "out"
    assert cli.main(["run", "--config", str(f), "--out", str(out)]) == 0
    per = pd.read_csv(out / "points" / "point00_replicas.csv")
    assert list(per["hardware"]) == ["H100-SXM TP1", "A100-80GB TP1"]
    # The faster replica drains its queue sooner, so join-the-shortest-queue feeds it more.
    assert per.loc[0, "routed"] > per.loc[1, "routed"]
    assert (out / "figures" / "replica_load.png").stat().st_size > 1000


def test_cluster_fields_settable_and_sweepable(tmp_path) -> None:
    out = tmp_path / "sw"
    rc = cli.main(["sweep", "--set", "num_replicas=2", "--grid",
                   "router=round_robin,prefix_affinity", "--requests", "30", "--workers", "1",
                   "--out", str(out)])
    assert rc == 0
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["router"]) == ["round_robin", "prefix_affinity"]
    assert (summary["num_replicas"] == 2).all()


def test_bad_cluster_config_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="cluster.router"):
        from_dict({"cluster": {"router": "random"}})
    with pytest.raises(ConfigError, match="replica 0: 'gpu' is not"):
        from_dict({"cluster": {"num_replicas": 2, "replicas": [{"gpu": "H100"}]}})
    with pytest.raises(ConfigError, match="only \\[engine\\] and \\[scheduler\\]"):
        from_dict({"cluster": {"num_replicas": 2, "replicas": [{"rate": 3.0}]}})
    with pytest.raises(ConfigError, match="3 per-replica entries"):
        from_dict({"cluster": {"num_replicas": 2, "replicas": [{}, {}, {}]}})
    with pytest.raises(ConfigError, match="block_size"):
        from_dict({"cluster": {"num_replicas": 2, "replicas": [{"block_size": 0}]}})


def test_trace_cycle_repeats_lengths_and_keeps_time_moving() -> None:
    from twinserve.sim.build import build_workload

    cfg = small_config(trace="builtin:azure_conv", arrival="trace", prompt_dist="trace",
                       output_dist="trace", num_requests=10**6, max_model_len=8192,
                       allow_short_trace=True)  # the whole trace, once
    once = list(build_workload(cfg).items())
    cfg.workload.trace_cycle = True
    cfg.workload.num_requests = 2 * len(once) + 5
    twice = list(build_workload(cfg).items())
    assert len(twice) == cfg.workload.num_requests
    n = len(once)
    assert [i.num_prompt_tokens for i in twice[n:2 * n]] == [i.num_prompt_tokens for i in once]
    times = [i.arrival_time for i in twice]
    assert times == sorted(times) and times[n] > times[n - 1]


def test_streamed_records_match_the_in_memory_tables(tmp_path) -> None:
    from twinserve.sim.cluster_study import build_cluster, cluster_frames
    from twinserve.sim.stream import RecordStream

    cfg = small_config(num_replicas=3, router="power_of_two", rate=12.0, num_requests=120)
    _, kept = simulate_cluster(cfg)
    req, _ = cluster_frames(kept)
    sink = RecordStream(tmp_path / "r.csv")
    built = build_cluster(cfg, keep_steps=False, keep_records=False, on_record=sink)
    streamed = built.simulation.run()
    sink.close()
    assert streamed.total.records == [] and len(streamed.replicas[0].steps) == 0
    assert streamed.routed == kept.routed and streamed.busy_time == kept.busy_time
    s = sink.summary()
    assert s["completed"] == len(req) == 120
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        for q in (50, 99):
            assert s[f"p{q}_{col}"] == pytest.approx(req[col].quantile(q / 100), rel=1e-12)
    on_disk = pd.read_csv(tmp_path / "r.csv")
    assert sorted(on_disk["request_id"]) == sorted(req["request_id"])
    assert on_disk.set_index("request_id")["replica"].to_dict() == \
        req.set_index("request_id")["replica"].to_dict()


DISAGG = dict(num_replicas=3, num_prefill_replicas=1, router="least_outstanding",
              trace="builtin:azure_conv", prompt_dist="trace", output_dist="trace",
              num_requests=120, rate=5.0)


def test_disaggregation_moves_kv_at_link_cost_and_keeps_every_token() -> None:
    fast_built, fast = simulate_cluster(small_config(kv_link_latency_s=1e-5, **DISAGG))
    slow_built, slow = simulate_cluster(small_config(kv_link_latency_s=1.0, **DISAGG))
    sim = slow_built.simulation
    by_id = {r.request_id: r for r in fast.total.records}
    assert len(slow.total.records) == len(by_id) == 120
    multi = 0
    for r in slow.total.records:
        f = by_id[r.request_id]
        # The prefill pool does not see the link: first tokens come at the same times.
        assert r.first_token_time == f.first_token_time
        assert r.num_output_tokens == f.num_output_tokens == len(r.token_times)
        assert r.replica >= 1 or r.num_output_tokens == 1  # ended on a decode replica
        if r.num_output_tokens > 1:
            multi += 1
            gap = r.token_times[1] - r.token_times[0]
            assert gap >= sim.transfer_seconds(r.num_prompt_tokens) >= 1.0
            assert f.token_times[1] - f.token_times[0] < 0.5
    assert multi > 100
    # Decode replicas price only the first token's own KV, never the transferred prompt.
    for i in (1, 2):
        totals = slow_built.engines[i].executor.totals
        assert totals.num_prefill_tokens == slow.routed[i] > 0
    assert slow.routed[0] == 120


def test_disaggregated_first_token_from_the_decode_replica_waits_for_the_transfer_and_its_step() -> None:
    """disagg_first_token = "decode": the client's first token is the decode replica's first step for
    the request (the front ends stream from the decode worker), so TTFT takes the KV transfer and
    that step; the run itself, the token counts and the finish times are the same as "prefill"'s."""
    fields = dict(kv_link_latency_s=0.5, **DISAGG)
    pre_built, pre = simulate_cluster(small_config(**fields))
    _, dec = simulate_cluster(small_config(disagg_first_token="decode", **fields))
    link = pre_built.simulation.transfer_seconds
    by_id = {r.request_id: r for r in pre.total.records}
    multi = 0
    for r in dec.total.records:
        p = by_id[r.request_id]
        assert (r.finish_time, r.num_output_tokens, r.arrival_time) == \
            (p.finish_time, p.num_output_tokens, p.arrival_time)
        if r.num_output_tokens == 1:  # nothing to decode: the prefill replica's token is the client's
            assert r.first_token_time == p.first_token_time
            continue
        multi += 1
        # After the prefill's token, the transfer, then at least one decode step.
        assert r.first_token_time > p.first_token_time + link(r.num_prompt_tokens) >= 0.5
        # The decode replica's first step is the one the prefill run records as the second token.
        assert r.first_token_time == p.token_times[1]
        assert r.token_times[0] == r.token_times[1] == r.first_token_time
    assert multi > 100


def test_disaggregated_first_token_at_the_decode_replicas_admission_comes_before_its_step() -> None:
    """disagg_first_token = "decode_admit" (SGLang's prebuilt batch): the first token reaches the client at the
    decode replica's step boundary that takes the transferred request, one step before "decode" has it; the
    run itself and every later token are the same."""
    fields = dict(kv_link_latency_s=0.5, **DISAGG)
    pre_built, pre = simulate_cluster(small_config(**fields))
    _, dec = simulate_cluster(small_config(disagg_first_token="decode", **fields))
    _, adm = simulate_cluster(small_config(disagg_first_token="decode_admit", **fields))
    link = pre_built.simulation.transfer_seconds
    by_pre = {r.request_id: r for r in pre.total.records}
    by_dec = {r.request_id: r for r in dec.total.records}
    multi = 0
    for r in adm.total.records:
        p, d = by_pre[r.request_id], by_dec[r.request_id]
        assert (r.finish_time, r.num_output_tokens) == (d.finish_time, d.num_output_tokens)
        if r.num_output_tokens == 1:
            assert r.first_token_time == p.first_token_time
            continue
        multi += 1
        # After the prefill's token and the transfer, at the boundary before the decode replica's first step.
        assert p.first_token_time + link(r.num_prompt_tokens) <= r.first_token_time < d.first_token_time
        assert r.token_times[0] == r.first_token_time and r.token_times[1:] == d.token_times[1:]
    assert multi > 100
    with pytest.raises(ValueError, match="decode_admit"):
        simulate_cluster(small_config(disagg_first_token="first", **fields))


def test_disaggregation_summary_and_per_replica_pools(tmp_path) -> None:
    out = tmp_path / "d"
    assert cli.main(["run", "--set", "num_replicas=3", "--set", "num_prefill_replicas=1",
                     "--requests", "40", "--out", str(out)]) == 0
    per = pd.read_csv(out / "points" / "point00_replicas.csv")
    assert list(per["hardware"].str.split().str[-1]) == ["prefill", "decode", "decode"]
    summary = pd.read_csv(out / "summary.csv")
    assert summary.loc[0, "completed"] == 40 and summary.loc[0, "kv_transfer_s_total"] > 0


def test_decode_replicas_judge_the_fit_range_on_the_steps_they_price(tmp_path) -> None:
    """A decode replica prices a transferred request's first step without the prompt's prefill,
    so only that step's own shape is held against the shapes the profile was fitted on: here
    every prompt is beyond the fitted prefill size, on the prefill replica only."""
    from twinserve.backends.sim.fitted import FittedCostModel, RANGE_DIMS

    top = dict.fromkeys(RANGE_DIMS, 1e9)
    top.update(num_prefill_tokens=8, num_tokens=8)  # the fit saw no prefill chunk over 8 tokens
    prof = FittedCostModel(intercept_s=0.01, per_token_s=1e-4, per_decode_seq_s=0.001,
                           meta={"fit": {"range": top}})
    prof.save(tmp_path / "p.json")
    built, res = simulate_cluster(small_config(
        profile=str(tmp_path / "p.json"), cost_model="fitted", num_replicas=2, num_prefill_replicas=1,
        kv_link_latency_s=1e-4, num_requests=5, arrival="fixed", rate=0.5, prompt_dist="fixed",
        prompt_mean=100, output_dist="fixed", output_mean=5))
    assert len(res.total.records) == 5 and all(r.replica == 1 for r in res.total.records)
    prefill, decode = (built.engines[i].executor.totals for i in (0, 1))
    assert prefill.beyond_fit_steps == prefill.num_steps > 0  # every step prefilled 100 tokens
    assert decode.num_steps >= 5 * 4 and decode.beyond_fit_steps == 0


def test_decode_replicas_pay_the_profiles_wake_cost_after_idling(tmp_path) -> None:
    """A decode replica that idled prices its next steps with the profile's wake cost, as a
    single engine does: each request's first decode steps cost the extra time of the gap since
    the replica's previous step."""
    from twinserve.backends.sim.fitted import FittedCostModel

    woken = FittedCostModel(intercept_s=0.01, per_decode_seq_s=0.001, wake_idle_s=(1.0, 3.0),
                            wake_extra_s=((0.005, 0.002), (0.01, 0.005)))
    plain = dataclasses.replace(woken, wake_idle_s=(), wake_extra_s=())
    fields = dict(num_replicas=2, num_prefill_replicas=1, kv_link_latency_s=1e-4, num_requests=5,
                  arrival="fixed", rate=0.5, prompt_dist="fixed", prompt_mean=100, output_dist="fixed",
                  output_mean=5, cost_model="fitted")
    runs = []
    for name, prof in (("woken", woken), ("plain", plain)):
        prof.save(tmp_path / f"{name}.json")
        built, res = simulate_cluster(small_config(profile=str(tmp_path / f"{name}.json"), **fields))
        runs.append(sorted(res.total.records, key=lambda r: r.arrival_time))
    link = built.simulation.transfer_seconds(100)
    for i, (w, p) in enumerate(zip(*runs)):
        assert w.replica == p.replica == 1
        w_gaps = [b - a for a, b in zip(w.token_times, w.token_times[1:])]
        p_gaps = [b - a for a, b in zip(p.token_times, p.token_times[1:])]
        # The decode replica last stepped when the previous request finished (the first one
        # waited from the start).
        last = runs[0][i - 1].finish_time if i else 0.0
        (_, e0), (_, e1) = woken.wake_after(w.first_token_time + link - last)
        assert e0 > 0.007 or i == 0
        assert w_gaps[0] == pytest.approx(p_gaps[0] + e0)
        assert w_gaps[1] == pytest.approx(p_gaps[1] + e1)
        assert w_gaps[2:] == pytest.approx(p_gaps[2:])
