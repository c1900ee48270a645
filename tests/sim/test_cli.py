"""The simulate CLI: run with a TOML and overrides, sweep over a grid, default study shape."""

from __future__ import annotations

import pandas as pd
import pytest

from twinserve.sim import cli


def test_run_with_config_and_overrides(tmp_path, capsys) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[engine]\nmodel = "SmolLM2-135M"\nhardware = "H200"\n'
                 '[workload]\nnum_requests = 40\nrate = 20.0\n')
    out = tmp_path / "out"
    rc = cli.main(["run", "--config", str(f), "--set", "max_num_batched_tokens=1024",
                   "--set", "workload.output_mean=50", "--out", str(out)])
    assert rc == 0
    summary = pd.read_csv(out / "summary.csv")
    assert summary.loc[0, "completed"] == 40 and summary.loc[0, "model"] == "SmolLM2-135M"
    req = pd.read_csv(out / "points" / "point00_requests.csv")
    assert len(req) == 40 and req["ttft_s"].gt(0).all()
    assert (out / "figures" / "ttft_tpot_cdf.png").stat().st_size > 1000
    assert "SmolLM2-135M" in (out / "summary.md").read_text()


def test_sweep_grid_one_row_per_point(tmp_path) -> None:
    out = tmp_path / "sw"
    rc = cli.main(["sweep", "--grid", "max_num_batched_tokens=256,2048",
                   "--grid", "enable_prefix_caching=true,false", "--requests", "30",
                   "--workers", "2", "--out", str(out)])
    assert rc == 0
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 4
    assert sorted(zip(summary["max_num_batched_tokens"], summary["enable_prefix_caching"])) == \
        [(256, False), (256, True), (2048, False), (2048, True)]
    assert (out / "figures" / "latency_throughput.png").exists()


def test_errors_are_reported_not_raised(tmp_path, capsys) -> None:
    assert cli.main(["sweep", "--grid", "max_num_batched_tokens=12x", "--out",
                     str(tmp_path / "x")]) == 2
    assert "max_num_batched_tokens" in capsys.readouterr().err
    assert cli.main(["run", "--set", "no_such_field=1", "--out", str(tmp_path / "y")]) == 2
    assert "no_such_field" in capsys.readouterr().err


def test_default_study_small(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cli, "DEFAULT_GRID", {"scheduler.max_num_batched_tokens": ["512", "8192"],
                                              "workload.rate": ["2", "6"]})
    base = cli.default_study

    def small():
        cfg = base()
        cfg.workload.num_requests = 60
        return cfg

    monkeypatch.setattr(cli, "default_study", small)
    assert cli.main(["--out", str(tmp_path / "d"), "--workers", "1"]) == 0
    md = (tmp_path / "d" / "summary.md").read_text()
    assert "Llama-2-7B" in md and "latency_throughput.png" in md
    assert len(pd.read_csv(tmp_path / "d" / "summary.csv")) == 4


def test_out_given_before_the_subcommand_is_kept(tmp_path, monkeypatch) -> None:
    # The subcommand's own --out default used to overwrite it: the study landed in ./simulate-run.
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["--out", str(tmp_path / "mine"), "run", "--requests", "10"])
    assert rc == 0
    assert (tmp_path / "mine" / "summary.csv").exists()
    assert not (tmp_path / "simulate-run").exists()


# Each kept short where the count was taken (the old CLI ran them): 5 requests, an empty row filter.
@pytest.mark.parametrize("argv", [["--workers", "0", "run", "--requests", "5"],
                                  ["run", "--requests", "5", "--workers", "-2"],
                                  ["sweep", "--grid", "rate=1,2", "--requests", "5", "--workers", "0"],
                                  ["search", "--workers", "x"],
                                  ["validate", "--silicon", "--max-clients", "1", "--workers", "0"]])
def test_a_worker_count_below_one_is_a_usage_error_not_ignored(tmp_path, capsys, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --workers" in err and "processes >= 1" in err, err


@pytest.mark.parametrize("argv,flag", [(["validate", "--silicon", "--mode", "agg"], "--mode"),
                                       (["run", "--conf", "study.toml"], "--conf"),
                                       (["search", "--seed", "1", "--confi", "s.toml"], "--confi")])
def test_an_abbreviated_flag_is_refused_not_read_as_another(argv, flag, capsys) -> None:
    """`--mode` is not `--model`: a prefix of a flag exits 2 naming it, and runs nothing."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err
