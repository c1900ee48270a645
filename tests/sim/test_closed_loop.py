"""Closed-loop clients ([workload] concurrency): the invariants, the measured window, bad input."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim.cli import main
from twinserve.sim.config import StudyConfig
from twinserve.sim.study import run_point
from twinserve.sim.workload import Workload, WorkloadConfig, range_bounds
from twinserve.sim.world import RequestRecord

from .helpers import fingerprint, run, small_config

EPS = 1e-9


def closed(n: int, requests: int = 30, think: float = 0.0, warmup: int = 0, **fields) -> StudyConfig:
    """A small closed-loop study with short fixed-ish lengths (fast to simulate)."""
    cfg = small_config(concurrency=n, num_requests=requests, think_time_s=think,
                       warmup_requests=warmup, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                       output_dist="uniform", output_min=2, output_max=40, **fields)
    return cfg


def in_flight_at(records: list[RequestRecord], t: float) -> int:
    """Requests sent at or before t and not finished by t (intervals [arrival, finish))."""
    return sum(1 for r in records if r.arrival_time <= t + EPS and
               (r.finish_time if r.finish_time is not None else r.arrival_time) > t + EPS)


def by_client(records: list[RequestRecord]) -> dict[int, list[RequestRecord]]:
    out: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[r.client].append(r)
    for rs in out.values():
        rs.sort(key=lambda r: r.arrival_time)
    return out


def check_invariants(records: list[RequestRecord], n: int, think: float) -> None:
    """At most n in flight at any time; each client's requests one after another, think apart."""
    assert all(0 <= r.client < n for r in records)
    for r in records:
        assert in_flight_at(records, r.arrival_time) <= n
    for client, rs in by_client(records).items():
        for prev, nxt in zip(rs, rs[1:]):
            done = prev.finish_time if prev.finish_time is not None else prev.arrival_time
            # Exactly think after the last token: never earlier (a client waits), never later.
            assert nxt.arrival_time >= done + think - EPS, (client, prev.request_id, nxt.request_id)
            assert nxt.arrival_time == pytest.approx(done + think, abs=1e-9)


@settings(max_examples=25)
@given(n=st.integers(1, 6), think=st.sampled_from([0.0, 0.05, 0.4]), warmup=st.integers(0, 6),
       requests=st.integers(3, 25), replicas=st.sampled_from([1, 2, 3]),
       disagg=st.booleans(), ff=st.booleans(), seed=st.integers(0, 3), turns=st.sampled_from([1, 1, 3]))
def test_in_flight_never_exceeds_n_and_each_client_is_sequential(n, think, warmup, requests, replicas,
                                                                   disagg, ff, seed, turns) -> None:
    cfg = closed(n, requests, think, warmup, num_replicas=replicas, fast_forward=ff, seed=seed,
                 num_prefill_replicas=1 if disagg and replicas > 1 else 0, turns=turns,
                 followup_tokens=16, max_model_len=1024)
    res = run_point(cfg)
    recs = [r for r in _records(cfg)]
    firsts = [r for r in recs if r.turn == 0]
    assert len(firsts) == requests + warmup
    assert sum(r.warmup for r in firsts) == warmup
    assert all(r.warmup == (r.conversation in {f.conversation for f in firsts if f.warmup})
               for r in recs) if turns > 1 else len(recs) == requests + warmup
    check_invariants(recs, n, think)
    # The summary counts the measured requests only (every turn of a measured conversation).
    assert res.row["num_requests"] == sum(not r.warmup for r in recs)
    assert res.row["warmup_requests"] == sum(r.warmup for r in recs)


def _records(cfg: StudyConfig) -> list[RequestRecord]:
    from twinserve.sim.study import is_cluster

    if is_cluster(cfg):
        from twinserve.sim.cluster_study import simulate_cluster
        return simulate_cluster(cfg)[1].total.records
    return run(cfg).records


@pytest.mark.parametrize("n,replicas", [(1, 1), (4, 1), (7, 2)])
def test_in_flight_is_n_while_requests_remain(n: int, replicas: int) -> None:
    recs = _records(closed(n, requests=60, num_replicas=replicas))
    last_send = max(r.arrival_time for r in recs)
    # With no think time a finishing client sends at once: n in flight until the workload runs out.
    times = sorted({r.arrival_time for r in recs} | {r.finish_time for r in recs})
    steady = [t for t in times if t < last_send]
    assert len(steady) > 20
    for t in steady:
        assert in_flight_at(recs, t) == n, t
    assert in_flight_at(recs, max(r.finish_time for r in recs)) == 0


@pytest.mark.parametrize("replicas,prefill", [(1, 0), (3, 0), (3, 1)])
def test_fast_forward_and_stepping_agree(replicas: int, prefill: int) -> None:
    cfg = closed(5, requests=40, think=0.1, warmup=4, num_replicas=replicas,
                 num_prefill_replicas=prefill)
    a = run_point(cfg)
    cfg.run.fast_forward = False
    b = run_point(cfg)
    pd_a, pd_b = a.requests.drop(columns=["itl_s"]), b.requests.drop(columns=["itl_s"])
    assert pd_a.equals(pd_b)
    skip = {"sim_wall_s", "sim_requests_per_wall_s"}
    assert {k: v for k, v in a.row.items() if k not in skip} == \
        pytest.approx({k: v for k, v in b.row.items() if k not in skip}, nan_ok=True)
    if replicas == 1:
        cfg.run.fast_forward = True
        fa = fingerprint(run(cfg))
        cfg.run.fast_forward = False
        assert fingerprint(run(cfg)) == fa


def test_warm_up_rows_are_marked_and_left_out_of_the_summary() -> None:
    cfg = closed(3, requests=20, think=0.2, warmup=6)
    res = run_point(cfg)
    req = res.requests
    assert req["warmup"].sum() == 6 and (~req["warmup"]).sum() == 20
    measured = req[~req["warmup"]]
    row = res.row
    assert row["num_requests"] == 20 and row["completed"] == 20
    assert row["mean_e2e_s"] == pytest.approx(measured["e2e_s"].mean())
    assert row["p99_ttft_s"] == pytest.approx(measured["ttft_s"].quantile(0.99))
    # Throughput over the measured window: first measured send to last measured finish.
    window = measured["finish_s"].max() - measured["arrival_s"].min()
    assert row["duration_s"] == pytest.approx(window)
    assert row["request_throughput"] == pytest.approx(20 / window)
    assert row["output_throughput"] == pytest.approx(measured["output_tokens"].sum() / window)
    # The warm-up requests are the first sent: every one before the window opens.
    assert req[req["warmup"]]["arrival_s"].max() < measured["arrival_s"].min()
    # The step table marks the steps before the window the same way.
    steps = res.steps
    assert (steps["warmup"] == (steps["start_s"] < measured["arrival_s"].min())).all()
    assert steps["warmup"].any() and not steps["warmup"].all()


@pytest.mark.parametrize("think", [0.0, 0.3])
def test_one_client_throughput_is_one_over_e2e_plus_think(think: float) -> None:
    n = 40
    row = run_point(closed(1, requests=n, think=think, warmup=2)).row
    # The window holds n end-to-end latencies and the n - 1 think times between them.
    assert row["request_throughput"] == pytest.approx(n / (n * row["mean_e2e_s"] + (n - 1) * think),
                                                      rel=1e-9)
    assert row["request_throughput"] == pytest.approx(1 / (row["mean_e2e_s"] + think), rel=1 / n)
    if think == 0:
        assert row["request_throughput"] == pytest.approx(1 / row["mean_e2e_s"], rel=1e-9)


def test_a_client_carries_one_conversation_at_a_time() -> None:
    cfg = closed(3, requests=8, think=0.1, warmup=2, turns=3, followup_tokens=32,
                 max_model_len=2048)
    recs = _records(cfg)
    check_invariants(recs, 3, 0.1)
    for rs in by_client(recs).values():
        for prev, nxt in zip(rs, rs[1:]):
            if nxt.turn > 0:  # a follow-up comes from the same client, right after its last turn
                assert (nxt.conversation, nxt.turn) == (prev.conversation, prev.turn + 1)
    assert max(r.turn for r in recs) == 2
    # Warm-up counts conversations, as num_requests does: all their turns are warm-up.
    warm = {r.conversation for r in recs if r.warmup}
    assert len(warm) == 2 and all(r.warmup for r in recs if r.conversation in warm)


def test_open_loop_tables_have_no_client_columns() -> None:
    res = run_point(small_config(num_requests=20))
    assert "warmup" not in res.requests.columns and "client" not in res.requests.columns
    assert "warmup_requests" not in res.row and "warmup" not in res.steps.columns


def test_refused_requests_free_their_client() -> None:
    # A KV pool of 160 tokens refuses the longer prompts at once; their clients go on.
    for replicas in (1, 2):
        recs = _records(closed(2, requests=16, think=0.05, num_gpu_blocks=10, num_replicas=replicas))
        assert len(recs) == 16
        assert 0 < sum(r.finish_reason == "refused" for r in recs) < 16
        check_invariants(recs, 2, 0.05)


@settings(max_examples=30)
@given(length=st.integers(1, 5000), ratio=st.floats(0.0, 0.99), seed=st.integers(0, 5))
def test_random_range_ratio_draws_vllms_range(length: int, ratio: float, seed: int) -> None:
    low, high = range_bounds(length, ratio)
    assert low == max(1, math.floor(length * (1 - ratio))) and high == max(1, math.ceil(length * (1 + ratio)))
    cfg = WorkloadConfig(num_requests=200, prompt_dist="fixed", prompt_mean=length, prompt_min=1,
                         prompt_max=20000, output_dist="fixed", output_mean=length, output_min=1,
                         output_max=20000, random_range_ratio=ratio)
    items = list(Workload(cfg, seed, max_model_len=50000).items())
    for kind in ("num_prompt_tokens", "num_output_tokens"):
        v = [getattr(it, kind) for it in items]
        assert low <= min(v) and max(v) <= high
        if high - low <= 4:  # a narrow range is covered end to end in 200 draws
            assert min(v) == low and max(v) == high


def test_range_ratio_zero_is_the_fixed_length() -> None:
    cfg = WorkloadConfig(num_requests=20, prompt_dist="fixed", prompt_mean=300, output_dist="fixed",
                         output_mean=30)
    assert {(it.num_prompt_tokens, it.num_output_tokens) for it in Workload(cfg).items()} == {(300, 30)}
    wide = dataclasses.replace(cfg, random_range_ratio=0.5)
    lens = {it.num_prompt_tokens for it in Workload(wide).items()}
    assert len(lens) > 5 and min(lens) >= 150 and max(lens) <= 450


STUDY = """[engine]
model = "Llama-2-7B"
hardware = "A100-80GB"

[workload]
num_requests = 10
"""


@pytest.mark.parametrize("lines,field,line_no", [
    ("concurrency = 0", "workload.concurrency", 7),
    ("concurrency = -3", "workload.concurrency", 7),
    ("concurrency = 2.5", "workload.concurrency", 7),
    ('concurrency = "four"', "workload.concurrency", 7),
    ("concurrency = true", "workload.concurrency", 7),
    ("concurrency = 4\nrate = 2.0", "workload.concurrency", 7),
    ('arrival = "poisson"\nconcurrency = 4', "workload.concurrency", 8),
    ("concurrency = 4\nthink_time_s = -1", "workload.think_time_s", 8),
    ("concurrency = 4\nwarmup_requests = -2", "workload.warmup_requests", 8),
    ("warmup_requests = 5", "workload.warmup_requests", 7),
    ("think_time_s = 1.0", "workload.think_time_s", 7),
    ('prompt_dist = "fixed"\nrandom_range_ratio = 1.0', "workload.random_range_ratio", 8),
    ('prompt_dist = "fixed"\nrandom_range_ratio = -0.1', "workload.random_range_ratio", 8),
    ("random_range_ratio = 0.5", "workload.random_range_ratio", 7),  # lognormal lengths
    ('prompt_dist = "fixed"\nprompt_mean = 4000\nrandom_range_ratio = 0.5',
     "workload.random_range_ratio", 9),
])
def test_bad_closed_loop_input_exits_2_naming_file_line_and_field(tmp_path, capsys, lines: str,
                                                                  field: str, line_no: int) -> None:
    f = tmp_path / "s.toml"
    f.write_text(STUDY + lines + "\n")
    rc = main(["run", "--config", str(f), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"{f}:{line_no}" in err and field in err, err
    assert "Traceback" not in err


def test_set_a_rate_on_a_closed_loop_study_exits_2(tmp_path, capsys) -> None:
    f = tmp_path / "s.toml"
    f.write_text(STUDY + "concurrency = 4\n")
    rc = main(["run", "--config", str(f), "--set", "rate=3", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "concurrency" in err and "rate" in err, err


def test_simulate_run_prints_the_closed_loop_line(tmp_path, capsys) -> None:
    f = tmp_path / "s.toml"
    f.write_text(STUDY + "concurrency = 3\nthink_time_s = 0.5\nwarmup_requests = 4\n")
    assert main(["run", "--config", str(f), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "summary.md").read_text()
    assert "closed loop: 3 clients, think 0.5 s, 4 warm-up requests" in md


def test_use_closed_loop_switches_a_study_with_a_rate(tmp_path) -> None:
    from twinserve.sim.config import ConfigError, load_config, set_field, use_closed_loop, validate

    f = tmp_path / "s.toml"
    f.write_text(STUDY + "rate = 3.0\narrival = \"poisson\"\n")
    cfg = load_config(f)
    with pytest.raises(ConfigError, match="concurrency"):
        set_field(cfg, "concurrency", 4)
        validate(cfg)
    cfg = load_config(f)
    use_closed_loop(cfg, 4)
    validate(cfg)
    assert cfg.workload.concurrency == 4
    with pytest.raises(ConfigError, match="concurrency"):
        use_closed_loop(cfg, 0)


def test_the_replica_table_counts_measured_requests() -> None:
    res = run_point(closed(4, requests=30, warmup=10, num_replicas=2))
    per = res.replicas
    assert per["completed"].sum() == 30 and per["routed"].sum() == 40
    measured = res.requests[~res.requests["warmup"]]
    for i, row in per.iterrows():
        mine = measured[measured["replica"] == row["replica"]]
        assert row["p50_ttft_s"] == pytest.approx(mine["ttft_s"].median())


def test_a_grid_of_clients_with_zero_is_refused_before_any_point_runs(tmp_path, capsys) -> None:
    f = tmp_path / "s.toml"
    f.write_text(STUDY + "concurrency = 4\n")
    rc = main(["sweep", "--config", str(f), "--grid", "concurrency=4,0", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "field 'workload.concurrency': 0 must be an integer >= 1" in err, err
    assert not (tmp_path / "o").exists()
