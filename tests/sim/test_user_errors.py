"""`simulate` and the study API on bad configs and traces: a typed error naming file, line and field,
exit status 2 and no traceback; nothing silently vanishes."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import simpy

from twinserve.backends.sim.executor import SimExecutor, StepTimeError
from twinserve.core.errors import InvalidConfigError, InvalidRequestError, InvalidSamplingParamsError
from twinserve.sim import cli
from twinserve.sim.build import simulate
from twinserve.sim.config import load_config
from twinserve.sim.errors import ConfigError, TraceError
from twinserve.sim.traces import read_trace

from .helpers import small_config, time_limit

STUDY = '[engine]\nmodel = "SmolLM2-135M"\nhardware = "H200"\n[workload]\nnum_requests = 20\nrate = 20.0\n'


def _run_cli(args: list[str], capsys) -> tuple[int, str]:
    rc = cli.main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.mark.parametrize("error", [
    TraceError("t.csv", 7, "arrived_at", "bad"), ConfigError("workload.rate", "bad", "s.toml", 3),
    InvalidConfigError("block_size", 3, "x"), InvalidSamplingParamsError("top_k", 2, "y"),
    InvalidRequestError("too long", "prompt"),
])
def test_typed_errors_survive_simpy_and_pickle(error: Exception) -> None:
    env = simpy.Environment()

    def proc():
        yield env.timeout(1)
        raise error

    env.process(proc())
    with pytest.raises(type(error)) as got:
        env.run()
    assert str(got.value) == str(error)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)


def _trace(tmp_path: Path, rows: list[str], header: str = "num_prefill_tokens,num_decode_tokens,arrived_at") -> Path:
    p = tmp_path / "trace.csv"
    p.write_text("\n".join([header] + rows) + "\n")
    return p


def _trace_study(tmp_path: Path, trace: Path, extra: str = "") -> Path:
    f = tmp_path / "s.toml"
    f.write_text(STUDY + f'arrival = "trace"\nprompt_dist = "trace"\noutput_dist = "trace"\ntrace = "{trace}"\n'
                 + extra)
    return f


def test_bad_trace_row_mid_run_names_file_line_and_column(tmp_path, capsys) -> None:
    trace = _trace(tmp_path, ["10,5,0.0", "12,6,0.5", "12,oops,0.7", "8,3,0.9"])
    rc, err = _run_cli(["run", "--config", str(_trace_study(tmp_path, trace)), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2
    assert f"{trace}:4" in err and "num_decode_tokens" in err


def test_on_overlong_fail_works_from_simulate(tmp_path, capsys) -> None:
    trace = _trace(tmp_path, ["10,5,0.0", "9000,6,0.5"])
    study = _trace_study(tmp_path, trace, 'on_overlong = "fail"\n')
    rc, err = _run_cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{trace}:3" in err and "max_model_len" in err


def test_unsorted_arrivals_are_refused_with_the_line(tmp_path) -> None:
    trace = _trace(tmp_path, ["10,5,5.0", "12,6,1.0"])
    with pytest.raises(TraceError) as e:
        list(read_trace(trace))
    assert e.value.line == 3 and e.value.field == "arrived_at"


def test_arrivals_are_shifted_to_start_at_zero(tmp_path) -> None:
    trace = _trace(tmp_path, ["10,5,100.0", "12,6,101.5", "3,3,101.5"])
    assert [r.arrival_time for r in read_trace(trace)] == [0.0, 1.5, 1.5]
    cfg = load_config(_trace_study(tmp_path, trace, "allow_short_trace = true\n"))
    result = simulate(cfg)[1]
    assert len(result.records) == 3
    assert min(r.arrival_time for r in result.records) == 0.0


@pytest.mark.parametrize("setting,field", [
    ("rate=nan", "workload.rate"), ("rate=inf", "workload.rate"), ("prompt_mean=nan", "workload.prompt_mean"),
    ("gpu_memory_utilization=1.5", "engine.gpu_memory_utilization"),
    ("gpu_memory_utilization=0", "engine.gpu_memory_utilization"),
    ("max_model_len=1000000", "scheduler.max_model_len"),
    ("prompt_min=600", "workload.prompt_min"), ("turns=0", "workload.turns"),
    ("output_mean=0", "workload.output_mean"), ("prompt_mean=-5", "workload.prompt_mean"),
    ("slo.ttft_s=-1", "slo.ttft_s"), ("think_time=nan", "workload.think_time"),
    ("eff_gemm=0", "engine.eff_gemm"), ("step_overhead_s=-2", "engine.step_overhead_s"),
])
def test_bad_values_exit_2_naming_the_field(tmp_path, capsys, setting: str, field: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text(STUDY + "prompt_max = 500\n")
    rc, err = _run_cli(["run", "--config", str(f), "--set", setting, "--out", str(tmp_path / "o")], capsys)
    assert rc == 2, err
    assert field in err


@pytest.mark.parametrize("line,field", [
    ("burstiness = nan", "workload.burstiness"), ("prompt_mean = -3.0", "workload.prompt_mean"), ("turns = 0", "workload.turns"),
])
def test_bad_toml_values_name_file_and_line(tmp_path, capsys, line: str, field: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text(STUDY + line + "\n")
    rc, err = _run_cli(["run", "--config", str(f), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{f}:7" in err and field in err


def test_fields_set_in_code_are_validated_too() -> None:
    cfg = small_config()
    cfg.workload.prompt_min, cfg.workload.prompt_max = 500, 100
    with pytest.raises(ConfigError, match="prompt_min"):
        from twinserve.sim.config import validate
        validate(cfg)
    cfg = small_config()
    cfg.scheduler.max_model_len = 10 ** 6
    with pytest.raises(ConfigError, match="max_model_len"):
        simulate(cfg)


def test_sweep_checks_every_grid_point_before_starting_workers(tmp_path, capsys) -> None:
    f = tmp_path / "s.toml"
    f.write_text(STUDY)
    # Every point bad: exit 2 before any worker starts, nothing written.
    rc, err = _run_cli(["sweep", "--config", str(f), "--grid", "max_model_len=999998,999999", "--workers", "2",
                        "--out", str(tmp_path / "o")], capsys)
    assert rc == 2
    assert "max_model_len" in err and "999999" in err and "BrokenProcessPool" not in err
    assert not (tmp_path / "o").exists()
    # One bad point: it is named (exit 1) and the good one still runs and is written.
    rc, err = _run_cli(["sweep", "--config", str(f), "--grid", "max_model_len=2048,999999", "--workers", "2",
                        "--out", str(tmp_path / "o2")], capsys)
    assert rc == 1
    assert "max_model_len=999999" in err and "BrokenProcessPool" not in err
    summary = (tmp_path / "o2" / "summary.csv").read_text().splitlines()
    assert len(summary) == 2 and "2048" in summary[1]


def test_sweep_worker_failure_mid_run_is_reported(tmp_path, capsys) -> None:
    trace = _trace(tmp_path, ["10,5,0.0", "12,6,0.5", "12,-4,0.7"])
    rc, err = _run_cli(["sweep", "--config", str(_trace_study(tmp_path, trace)), "--grid", "rate=1,2",
                        "--workers", "2", "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{trace}:4" in err and "num_decode_tokens" in err


@pytest.mark.parametrize("fast_forward", [True, False])  # decode windows, or every step through execute()
def test_an_efficiency_that_overflows_the_step_time_is_a_typed_error_not_a_hang(fast_forward: bool) -> None:
    # Found by test_config_hypothesis: eff_memory=5e-324 is a fraction in (0, 1], but the roofline
    # divides by it and a step came out NaN; the clock stood still at NaN and the run never ended.
    cfg = small_config()
    cfg.run.fast_forward = fast_forward
    cfg.workload.num_requests = 20
    cfg.workload.rate = 50.0
    cfg.engine.eff_memory = 5e-324
    cfg.workload.burstiness = 0.134
    cfg.workload.prompt_max = 256
    with time_limit(20), pytest.raises(StepTimeError, match="finite, non-negative time") as got:
        simulate(cfg)
    assert "roofline" in str(got.value)
    again = pickle.loads(pickle.dumps(got.value))
    assert type(again) is StepTimeError and str(again) == str(got.value)


class _Priced:
    """A cost model that prices every step at one fixed time (NaN, inf or negative here)."""

    name = "fixed"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step_time(self, *features) -> float:
        return self.seconds


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1e-3])
def test_the_executor_refuses_a_step_time_the_clock_cannot_take(seconds: float) -> None:
    ex = SimExecutor(_Priced(seconds))
    with pytest.raises(StepTimeError, match="cost model fixed priced a step"):
        ex.decode_step_times(4, 100, 3, 0.0, float("inf"))
    ex = SimExecutor(_Priced(0.01))
    durations, ends = ex.decode_step_times(4, 100, 3, 0.0, float("inf"))
    assert durations == [0.01] * 3 and ends[-1] == pytest.approx(0.03)
