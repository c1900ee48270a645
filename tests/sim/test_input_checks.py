"""`simulate run|sweep|search` on inputs that used to crash or run on silently: each exits 2 naming the
file, the line and the field, with no traceback (issue 42, items 7-11)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from twinserve.sim import cli
from twinserve.sim.build import simulate
from twinserve.sim.config import load_config
from twinserve.sim.errors import ConfigError, TraceError
from twinserve.sim.workload import Workload, WorkloadConfig

from .helpers import small_config, time_limit

STUDY = '[engine]\nmodel = "SmolLM2-135M"\nhardware = "H200"\n[workload]\nnum_requests = 20\nrate = 20.0\n'
TRACE_KEYS = 'arrival = "trace"\nprompt_dist = "trace"\noutput_dist = "trace"\n'


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    rc = cli.main(args)
    got = capsys.readouterr()
    assert "Traceback" not in got.err
    return rc, got.out, got.err


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _trace_study(tmp_path: Path, body: str, extra: str = "", requests: int = 20) -> tuple[Path, Path]:
    trace = _write(tmp_path, "trace.csv", body)
    study = STUDY.replace("num_requests = 20", f"num_requests = {requests}")
    return trace, _write(tmp_path, "s.toml", study + TRACE_KEYS + f'trace = "{trace}"\n' + extra)


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("command,cycle", [
    (["run"], False), (["run"], True), (["sweep", "--grid", "max_num_seqs=8,16"], False), (["search"], False),
])
def test_a_header_only_trace_is_refused_at_its_header(tmp_path, capsys, command: list[str], cycle: bool) -> None:
    trace, study = _trace_study(tmp_path, "num_prefill_tokens,num_decode_tokens,arrived_at\n",
                                "trace_cycle = true\n" if cycle else "")
    with time_limit(60):  # cycling an empty trace must not spin
        rc, _, err = _cli([*command, "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{trace}:1:" in err and "no requests" in err and "workload.trace" in err
    assert not (tmp_path / "o").exists()


DISAGG = "[cluster]\nnum_replicas = 2\nnum_prefill_replicas = 1\n"
ENGINE = 'hardware = "H200"\n'


@pytest.mark.parametrize("text,setting,field", [
    (STUDY + DISAGG + "kv_link_bandwidth = 1e-300\n", "kv_link_bandwidth", "cluster.kv_link_bandwidth"),
    (STUDY + DISAGG + "kv_link_latency_s = 1e300\n", "kv_link_latency_s", "cluster.kv_link_latency_s"),
    (STUDY + "turns = 2\nthink_time = 1e308\n", "think_time", "workload.think_time"),
    (STUDY + "time_scale = 1e300\n", "time_scale", "workload.time_scale"),
    (STUDY + "rate = 1e-300\n", "rate = 1e-300", "workload.rate"),
    (STUDY.replace(ENGINE, ENGINE + "step_overhead_s = 1e300\n"), "step_overhead_s", "engine.step_overhead_s"),
    (STUDY + "[slo]\nttft_s = 1e308\n", "ttft_s", "slo.ttft_s"),
])
def test_out_of_range_times_are_refused_where_the_config_is_read(tmp_path, capsys, text: str,
                                                                  setting: str, field: str) -> None:
    study = _write(tmp_path, "s.toml", text.replace("rate = 20.0\n", "") if "rate = 1e" in text else text)
    with time_limit(60):
        rc, _, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2, err
    assert f"{study}:{_line(study, setting)}:" in err and field in err and "is invalid: allowed a number in" in err


def test_num_replicas_has_a_documented_limit(tmp_path, capsys) -> None:
    study = _write(tmp_path, "s.toml", STUDY + "[cluster]\nnum_replicas = 1000000\n")
    with time_limit(20):
        rc, _, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{study}:8:" in err and "cluster.num_replicas" in err and "1024" in err


def test_replicas_whose_kv_pools_would_not_fit_in_memory_are_refused_up_front(tmp_path, capsys) -> None:
    # SmolLM2 on an H200 holds ~340k KV blocks, each an object of the simulated pool (~120 B):
    # 200 replicas would need ~8 GiB before the first request.
    study = _write(tmp_path, "s.toml", STUDY + "[cluster]\nnum_replicas = 200\n")
    with time_limit(20):
        rc, _, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{study}:8:" in err and "cluster.num_replicas" in err and "GiB" in err
    from twinserve.sim.build import MAX_POOL_BYTES, check_pool_memory

    cfg = load_config(study)
    cfg.engine.num_gpu_blocks = 1000  # smaller pools: the same replicas fit
    assert check_pool_memory(cfg) <= MAX_POOL_BYTES


def test_a_trace_column_named_twice_is_refused(tmp_path, capsys) -> None:
    trace, study = _trace_study(tmp_path, "num_prefill_tokens,num_decode_tokens,num_decode_tokens,"
                                "arrived_at\n10,5,7,0.0\n12,6,8,0.5\n", requests=2)
    rc, _, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{trace}:1:" in err and "'num_decode_tokens'" in err and "twice" in err


def test_request_ids_of_a_trace_must_be_unique_and_name_the_requests(tmp_path, capsys) -> None:
    rows = "request_id,num_prefill_tokens,num_decode_tokens,arrived_at\na,10,5,0.0\nb,12,6,0.5\na,8,3,0.9\n"
    trace, study = _trace_study(tmp_path, rows, requests=3)
    rc, _, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{trace}:4:" in err and "request_id" in err and "line 2" in err
    trace.write_text(rows.replace("a,8", "c,8"))
    result = simulate(load_config(study))[1]
    assert sorted(r.request_id for r in result.records) == ["a", "b", "c"]


def test_a_multi_turn_study_whose_every_follow_up_is_dropped_fails(tmp_path, capsys) -> None:
    # First turns of 3900-4000 tokens leave no room under max_model_len = 4096 for a second turn.
    study = _write(tmp_path, "s.toml", STUDY + 'turns = 3\nprompt_dist = "uniform"\nprompt_min = 3900\n'
                   'prompt_max = 4000\noutput_dist = "fixed"\noutput_mean = 100\n')
    rc, _, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{study}:7:" in err and "workload.turns" in err and "every follow-up" in err
    # Some dropped, some not: it runs, and the summary counts the dropped ones.
    study.write_text(study.read_text().replace("prompt_min = 3900", "prompt_min = 3000")
                     .replace("prompt_max = 4000", "prompt_max = 3800"))
    rc, out, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o2")], capsys)
    assert rc == 0, err
    assert "follow-up turns dropped" in out


def test_a_trace_that_gives_fewer_requests_than_asked_fails_unless_allowed(tmp_path, capsys) -> None:
    trace, study = _trace_study(tmp_path, "num_prefill_tokens,num_decode_tokens,arrived_at\n10,5,0.0\n"
                                "12,6,0.5\n", requests=400)
    rc, _, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{trace}:3:" in err and "2 of the 400" in err and "allow_short_trace" in err
    rc, out, err = _cli(["run", "--config", str(study), "--set", "allow_short_trace=true",
                         "--out", str(tmp_path / "o2")], capsys)
    assert rc == 0, err
    assert "398 requests short" in out


def test_a_trace_without_num_requests_serves_every_row_and_says_so(tmp_path, capsys) -> None:
    """Issue 53 item 20: a short or clipped trace without num_requests runs its own length, not 400."""
    trace = _write(tmp_path, "trace.csv", "num_prefill_tokens,num_decode_tokens,arrived_at\n10,5,0.0\n"
                   "12,6,0.5\n9000,4,0.7\n")
    study = _write(tmp_path, "s.toml", STUDY.replace("num_requests = 20\n", "") + TRACE_KEYS
                   + f'trace = "{trace}"\non_overlong = "drop"\n')
    cfg = load_config(study)
    assert cfg.workload.num_requests == 3 and cfg.num_requests_from_trace
    rc, out, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err
    assert "workload: 3 requests (every row of the trace: num_requests not set)" in out
    # --requests set on top is a number asked for again: a trace short of it still exits 2.
    rc, out, err = _cli(["run", "--config", str(study), "--requests", "10", "--out", str(tmp_path / "o2")], capsys)
    assert rc == 2 and "of the 10 requests" in err


NO_COUNT = STUDY.replace("num_requests = 20\n", "")
ROWS = "num_prefill_tokens,num_decode_tokens,arrived_at\n" + "".join(f"{10 + i},5,{i / 2}\n" for i in range(5))


def test_a_trace_given_on_the_command_line_serves_every_row(tmp_path, capsys) -> None:
    """Issue 53 item 20: a trace set by --set is counted as one in the file is (it ran 400 and exited 2)."""
    trace = _write(tmp_path, "five.csv", ROWS)
    study = _write(tmp_path, "s.toml", NO_COUNT)  # synthetic lengths, no trace, no num_requests
    keys = ["--set", f"trace={trace}", "--set", "arrival=trace", "--set", "prompt_dist=trace",
            "--set", "output_dist=trace"]
    rc, out, err = _cli(["run", "--config", str(study), *keys, "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err
    assert "workload: 5 requests (every row of the trace: num_requests not set)" in out
    assert "5 completed" in out
    # An explicit count larger than the trace is still an error naming both counts.
    rc, out, err = _cli(["run", "--config", str(study), *keys, "--requests", "9",
                         "--out", str(tmp_path / "o2")], capsys)
    assert rc == 2 and "gives 5 of the 9 requests" in err


def test_another_trace_set_over_the_files_counts_its_own_rows(tmp_path, capsys) -> None:
    """--set trace= on a study whose own trace set the count: the new trace's rows, not the old count."""
    three = _write(tmp_path, "three.csv", "".join(ROWS.splitlines(keepends=True)[:4]))
    five = _write(tmp_path, "five.csv", ROWS)
    study = _write(tmp_path, "s.toml", NO_COUNT + TRACE_KEYS + f'trace = "{three}"\n')
    assert load_config(study).workload.num_requests == 3
    rc, out, err = _cli(["run", "--config", str(study), "--set", f"trace={five}",
                         "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err
    assert "workload: 5 requests (every row of the trace" in out and "5 completed" in out
    # Replaying it (trace_cycle) takes a count again: the study's default, not a trace's rows.
    cfg = load_config(study)
    from twinserve.sim.config import set_field
    set_field(cfg, "trace_cycle", "true")
    assert not cfg.num_requests_from_trace and cfg.workload.num_requests == WorkloadConfig().num_requests
    assert cfg.workload.allow_short_trace is False


def test_rows_dropped_from_a_counted_trace_are_not_also_called_short(tmp_path, capsys) -> None:
    trace = _write(tmp_path, "t.csv", "num_prefill_tokens,num_decode_tokens,arrived_at\n10,5,0.0\n"
                   "12,6,0.5\n9000,4,0.7\n")
    study = _write(tmp_path, "s.toml", NO_COUNT + TRACE_KEYS + f'trace = "{trace}"\non_overlong = "drop"\n')
    rc, out, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err
    assert "2 completed" in out and "1 dropped as over-long" in out
    assert "short of num_requests" not in out  # num_requests was never set: nothing ran short of it


def test_dropping_every_request_is_refused_instead_of_spinning(tmp_path) -> None:
    cfg = small_config(prompt_min=5000, prompt_max=6000, on_overlong="drop")
    with time_limit(20), pytest.raises(ConfigError, match="workload.on_overlong"):
        simulate(cfg)
    trace = _write(tmp_path, "t.csv", "num_prefill_tokens,num_decode_tokens\n9000,5\n9500,6\n")
    wl = Workload(WorkloadConfig(arrival="poisson", prompt_dist="trace", output_dist="trace",
                                 on_overlong="drop", trace_cycle=True), trace_path=str(trace))
    with time_limit(20), pytest.raises(TraceError, match="no request of the trace fits"):
        list(wl.items())


def test_min_rate_above_max_rate_is_refused(tmp_path, capsys) -> None:
    study = _write(tmp_path, "s.toml", STUDY + "[search]\nmin_rate = 50\nmax_rate = 5\n")
    rc, _, err = _cli(["search", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{study}:8:" in err and "search.min_rate" in err


@pytest.mark.parametrize("prices", ['prices = { "H2O" = 1.0 }\n', '[search.prices]\n"h100-smx" = 2.0\n'])
def test_a_price_for_a_misspelt_gpu_is_refused(tmp_path, capsys, prices: str) -> None:
    study = _write(tmp_path, "s.toml", STUDY + "[search]\nmax_rate = 4\n" + prices)
    rc, _, err = _cli(["search", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{study}:{len(study.read_text().splitlines())}:" in err
    assert "search.prices" in err and "did you mean" in err and not (tmp_path / "o").exists()


REPLICAS = STUDY + '[cluster]\nnum_replicas = 2\nreplicas = [\n  {},\n  {hardware = "H100-SMX"},\n]\n'


@pytest.mark.parametrize("text,line,field", [
    (REPLICAS, 11, "cluster.replicas[1].hardware"),
    (STUDY + '[cluster]\nnum_replicas = 2\n[[cluster.replicas]]\nmax_num_seqs = 8\n[[cluster.replicas]]\n'
     'max_num_seqs = 4\nmodel = "Llama-9"\n', 13, "cluster.replicas[1].model"),
])
def test_a_per_replica_typo_is_blamed_on_its_replicas_entry(tmp_path, capsys, text: str, line: int,
                                                            field: str) -> None:
    study = _write(tmp_path, "s.toml", text)
    rc, _, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{study}:{line}:" in err and field in err


def test_a_lone_replicas_override_is_simulated_not_ignored(tmp_path, capsys) -> None:
    study = _write(tmp_path, "s.toml", STUDY + '[cluster]\nreplicas = [{hardware = "A100-80GB"}]\n')
    built, over = simulate(load_config(study))
    assert built.hardware.name == "A100-80GB"
    direct = load_config(study)
    direct.engine.hardware = "A100-80GB"
    direct.cluster.replicas = []
    same = simulate(direct)[1]
    base = dataclasses.replace(direct, engine=dataclasses.replace(direct.engine, hardware="H200"))
    other = simulate(base)[1]
    finish = [r.finish_time for r in over.records]
    assert finish == [r.finish_time for r in same.records] != [r.finish_time for r in other.records]
    rc, out, err = _cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err
    assert "1x A100-80GB" in out and "replicas entry: hardware = 'A100-80GB'" in out


def test_a_field_that_does_not_exist_is_refused_at_its_line_naming_the_known_ones(tmp_path, capsys) -> None:
    # An SLO written as a statistic ([slo] has ttft_s / tpot_s; percentiles go through --slo).
    f = _write(tmp_path, "s.toml", STUDY + "[slo]\nttft_p99 = 1.0\n")
    rc, _, err = _cli(["run", "--config", str(f), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{f}:8: field 'slo.ttft_p99': no such field; known: tpot_s, ttft_s" in err, err
