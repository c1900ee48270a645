"""`simulate search`'s answers as a deployer reads them: bands, ties, the pick's commands,
nothing-fits, run lengths and bad input."""

from __future__ import annotations

import json
import math
import shlex

import pandas as pd
import pytest

from twinserve.sim import cli
from twinserve.sim.search_band import seed_band
from twinserve.sim.search_commands import TWINSERVE_SERVE_FLAGS, VLLM_BENCH_FLAGS, VLLM_SERVE_FLAGS

from .helpers import small_config

# Flags as vLLM's own pages spell them, written out here apart from sim/search_commands.py's
# list so a flag added there by mistake fails: https://docs.vllm.ai/en/latest/models/engine_args.html
# and https://docs.vllm.ai/en/latest/cli/bench/serve/
VLLM_DOCS = {"--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens",
             "--max-model-len", "--quantization", "--kv-cache-dtype", "--enable-prefix-caching",
             "--no-enable-prefix-caching", "--dtype", "--model", "--dataset-name",
             "--random-input-len", "--random-output-len", "--num-prompts", "--request-rate",
             "--max-concurrency", "--seed"}
STUDY = ('[engine]\nmodel = "Llama-2-7B"\nhardware = "A100-80GB"\n'
         '[workload]\nprompt_dist = "uniform"\nprompt_min = 100\nprompt_max = 1000\n'
         'output_dist = "uniform"\noutput_min = 20\noutput_max = 200\n'
         '[search]\ntarget_rate = 10.0\nrequests_per_run = 100\nmax_requests_per_run = 200\n')


def _search(tmp_path, name: str, *extra: str, study: str = STUDY) -> tuple[int, object]:
    f = tmp_path / f"{name}.toml"
    f.write_text(study)
    out = tmp_path / name
    rc = cli.main(["search", "--config", str(f), "--workers", "1", "--out", str(out), *extra])
    return rc, out


def _flags(command: str) -> list[str]:
    return [t for t in shlex.split(command) if t.startswith("--")]


def test_band_contains_the_answers_of_other_seeds(tmp_path, capsys) -> None:
    study = STUDY.replace("requests_per_run = 100\nmax_requests_per_run = 200",
                          "requests_per_run = 150\nmax_requests_per_run = 300")
    rc, out = _search(tmp_path, "band", study=study)  # seeds 0 (the answer), 1 and 2 (its band)
    assert rc == 0
    row = pd.read_csv(out / "search.csv").iloc[0]
    for seed in (3, 4):
        rc, other = _search(tmp_path, f"seed{seed}", "--seed", str(seed), "--set",
                            "search.band_seeds=0", study=study)
        answer = pd.read_csv(other / "search.csv").iloc[0]["max_rate"]
        assert row["band_lo"] <= answer <= row["band_hi"], (seed, answer, row["seed_rates"])
    capsys.readouterr()
    assert seed_band([1.0, 2.0, 3.0]) == pytest.approx((0.0, 2 + 4.303 * 1.1547), abs=1e-3)
    assert seed_band([10.0, 10.2, 10.4])[0] == pytest.approx(10.2 - 4.303 * 0.2 * 1.1547, abs=1e-3)


def test_seeds_0_and_1_give_the_same_pick_or_name_each_other_as_ties(tmp_path, capsys) -> None:
    picks = {}
    for seed in (0, 1):
        rc, out = _search(tmp_path, f"s{seed}", "--grid", "hardware=A100-80GB,H100-SXM",
                          "--seed", str(seed))
        assert rc == 0
        p = json.loads((out / "pick.json").read_text())
        picks[seed] = (p["pick"]["hardware"], {t["hardware"] for t in p["ties"]})
    capsys.readouterr()
    (a, a_ties), (b, b_ties) = picks[0], picks[1]
    assert a == b or (b in a_ties and a in b_ties), picks


def test_pick_json_and_summary_carry_commands_with_only_known_flags(tmp_path, capsys) -> None:
    study = STUDY.replace('hardware = "A100-80GB"\n',
                          'hardware = "H100-SXM"\nquantization = "fp8"\nkv_cache_dtype = "fp8"\n')
    rc, out = _search(tmp_path, "fp8", study=study)
    capsys.readouterr()
    assert rc == 0
    pick = json.loads((out / "pick.json").read_text())["pick"]
    cmd = pick["commands"]
    assert cmd["vllm_serve"].startswith("vllm serve Llama-2-7B ")
    assert set(_flags(cmd["vllm_serve"])) <= VLLM_SERVE_FLAGS & VLLM_DOCS
    assert set(_flags(cmd["twinserve_serve"])) <= TWINSERVE_SERVE_FLAGS
    assert set(_flags(cmd["vllm_bench_serve"])) <= VLLM_BENCH_FLAGS & VLLM_DOCS
    assert "--quantization fp8" in cmd["vllm_serve"] and "--kv-cache-dtype fp8" in cmd["vllm_serve"]
    assert "--kv-cache-dtype" not in cmd["twinserve_serve"]  # twinserve serve has no such flag
    assert f"--request-rate {pick['check_rate_per_replica']:.3g}" in cmd["vllm_bench_serve"]
    assert pick["band"][0] <= pick["max_rate"] <= pick["band"][1]
    summary = (out / "summary.md").read_text()
    assert cmd["vllm_serve"] in summary and cmd["vllm_bench_serve"] in summary
    assert "LOW end of each band" in summary
    assert "cost-model error: unknown (no validate rows)" in summary


def test_replicas_come_from_the_low_end_of_the_band(tmp_path, capsys) -> None:
    rc, out = _search(tmp_path, "band")
    capsys.readouterr()
    assert rc == 0
    row = pd.read_csv(out / "search.csv").iloc[0]
    assert row["band_lo"] <= row["max_rate"]
    assert row["replicas_for_target"] == -(-10.0 // row["band_lo"])


def test_model_error_file_widens_the_band(tmp_path, capsys) -> None:
    errs = tmp_path / "summary.json"
    errs.write_text(json.dumps([{"backend": "vllm", "system": "a100_sxm", "model": "Llama-2-7B",
                                 "median_abs_throughput_error_pct": 20.0}]))
    study = STUDY + f'model_error = "{errs}"\nband_seeds = 0\n'
    rc, out = _search(tmp_path, "err", "--target-rate", "200", study=study)
    capsys.readouterr()
    assert rc == 0
    row = pd.read_csv(out / "search.csv").iloc[0]
    assert row["band_lo"] == pytest.approx(row["max_rate"] * 0.8)
    # Provisioned for the band's low end: more replicas than the answer alone would say.
    assert row["replicas_for_target"] == math.ceil(200 / row["band_lo"])
    assert row["replicas_for_target"] > math.ceil(200 / row["max_rate"])
    assert "cost-model error 20%" in (out / "summary.md").read_text()


def test_model_error_reads_simulate_validates_own_summary(tmp_path) -> None:
    from twinserve.sim.search_band import model_error

    f = tmp_path / "summary.json"
    f.write_text(json.dumps({"all": {"overall": {}, "groups": {
        "sglang | h200_sxm | meta-llama/Llama-3.1-70B": {"tput": {"median_abs": 0.3}},
        "vllm | h200_sxm | nvidia/Llama-3.1-70B-Instruct-FP8": {"tput": {"median_abs": 0.12},
                                                             "tpot": {"median_abs": 0.2}}}}}))
    cfg = small_config()
    cfg.search.model_error = str(f)
    err, note = model_error(cfg, "Llama-3.1-70B", "H200")
    assert err == pytest.approx(0.12) and "vllm" in note  # vLLM's rows, throughput's error
    assert model_error(cfg, "Llama-3.1-70B", "H100-SXM")[0] is None


def test_nothing_fits_exits_3_and_says_why_for_each(tmp_path, capsys) -> None:
    rc, out = _search(tmp_path, "none", "--slo", "tpot_p99=0.0001", "--grid",
                      "hardware=A100-80GB,H100-SXM")
    capsys.readouterr()
    assert rc == 3
    summary = (out / "summary.md").read_text()
    assert "NOTHING FITS" in summary
    assert "hardware=A100-80GB: no rate down to min_rate" in summary
    assert "hardware=H100-SXM: no rate down to min_rate" in summary
    assert json.loads((out / "pick.json").read_text())["pick"] is None
    big = STUDY.replace('"Llama-2-7B"', '"Llama-3.1-70B"')
    rc, out = _search(tmp_path, "big", study=big)
    capsys.readouterr()
    assert rc == 3 and "weights take" in (out / "summary.md").read_text()


def test_requests_is_the_first_run_length_and_one_statement_says_the_lengths(tmp_path, capsys) -> None:
    rc, out = _search(tmp_path, "len", "--requests", "60", "--set", "search.band_seeds=0")
    capsys.readouterr()
    assert rc == 0
    table = pd.read_csv(out / "search.csv")
    assert table.loc[0, "num_requests"] == 120  # 60, rechecked at 120
    summary = (out / "summary.md").read_text()
    assert "runs start at 60 requests" in summary and "runs of 120 requests" in summary


@pytest.mark.parametrize("body, extra, field, line", [
    ("[search.grid]\n", [], "search.grid", 15),
    ("[search.grid]\ntensor_parallel_size = []\n", [], "search.grid", 16),
    ("", ["--target-rate", "-1"], "--target-rate", None),
    ("", ["--slo", "latency_p99=2"], "--slo", None),
])
def test_bad_input_exits_2_naming_file_line_and_field(tmp_path, capsys, body, extra, field,
                                                      line) -> None:
    rc, _ = _search(tmp_path, "bad", *extra, study=STUDY + body)
    err = capsys.readouterr().err
    assert rc == 2 and field in err, err
    if line is not None:
        assert f"bad.toml:{line}" in err or f"line {line}" in err, err


def test_target_rate_zero_in_the_file_is_refused_at_its_line(tmp_path, capsys) -> None:
    rc, _ = _search(tmp_path, "zero", study=STUDY.replace("target_rate = 10.0", "target_rate = 0"))
    err = capsys.readouterr().err
    assert rc == 2 and "search.target_rate" in err and ("zero.toml:12" in err or "line 12" in err), err


def test_a_disaggregation_split_larger_than_the_replicas_is_refused(tmp_path, capsys) -> None:
    study = STUDY + "[cluster]\nnum_replicas = 2\nnum_prefill_replicas = 3\n"
    rc, _ = _search(tmp_path, "split", study=study)
    err = capsys.readouterr().err
    assert rc == 2 and "num_prefill_replicas" in err, err


def test_concurrency_axis_finds_the_most_clients_and_benches_with_max_concurrency(tmp_path,
                                                                                  capsys) -> None:
    study = STUDY.replace("[search]\n", '[search]\naxis = "concurrency"\nband_seeds = 0\n')
    rc, out = _search(tmp_path, "clients", "--slo", "tpot_p99=0.03", "--slo", "ttft_p99=1",
                      study=study)
    capsys.readouterr()
    assert rc == 0
    row = pd.read_csv(out / "search.csv").iloc[0]
    n = int(row["max_rate"])
    assert n == row["max_rate"] and row["bracket_hi"] == n + 1  # settled to one client
    runs = pd.read_csv(out / "search_runs.csv").set_index("rate")
    assert runs.loc[n, "meets_slo"] and not runs.loc[n + 1, "meets_slo"]
    assert row["request_rate"] == pytest.approx(runs.loc[n, "request_throughput"])
    bench = json.loads((out / "pick.json").read_text())["pick"]["commands"]["vllm_bench_serve"]
    assert f"--max-concurrency {n}" in bench and "--request-rate" not in bench
    assert "most closed-loop clients" in (out / "summary.md").read_text()


def test_disaggregation_auto_splits_the_gpu_budget_and_compares_per_gpu() -> None:
    from twinserve.sim.search_disagg import gpus_of, with_modes
    from twinserve.sim.study import grid_points

    base = small_config(tensor_parallel_size=1)
    base.search.disaggregation, base.search.gpu_budget = "auto", 4
    points = with_modes(base, grid_points(base, {"engine.tensor_parallel_size": ["1", "2"]}))
    modes = [(p["tensor_parallel_size"], p["mode"]) for p, _ in points]
    assert modes == [(1, "agg"), (1, "disagg 1P+3D"), (1, "disagg 2P+2D"), (1, "disagg 3P+1D"),
                     (2, "agg"), (2, "disagg 1P+1D")]
    for p, cfg in points:
        assert gpus_of(cfg) == (4 if p["mode"].startswith("disagg") else p["tensor_parallel_size"])


@pytest.mark.parametrize("body, field", [
    ('disaggregation = "auto"\n', "search.disaggregation"),
    ("gpu_budget = 2\n[cluster]\nnum_replicas = 3\nnum_prefill_replicas = 1\n", "search.gpu_budget"),
])
def test_a_split_beyond_the_gpu_budget_is_refused(tmp_path, capsys, body, field) -> None:
    rc, _ = _search(tmp_path, "budget", study=STUDY + body)
    err = capsys.readouterr().err
    assert rc == 2 and field in err and "budget.toml:" in err, err


def test_commands_name_the_hugging_face_repo_of_a_catalog_model() -> None:
    from twinserve.sim.search_commands import commands, hf_model_id

    cfg = small_config(**{"engine.model": "Llama-3.1-70B", "engine.tensor_parallel_size": 4})
    cmd = commands(cfg, {"model": "Llama-3.1-70B"}, 4000, 500, 2.0, 100)
    assert cmd["vllm_serve"].startswith("vllm serve meta-llama/Llama-3.1-70B ")
    assert "--model meta-llama/Llama-3.1-70B " in cmd["vllm_bench_serve"]
    assert hf_model_id("qwen3-30b-a3b") == "Qwen/Qwen3-30B-A3B"
    assert hf_model_id("Llama-2-7B") == "Llama-2-7B"  # no source listed: the name as given


def test_seeds_on_one_bisection_value_still_give_a_band_as_wide_as_their_bracket() -> None:
    # Three seeds bisected to 5% on the same grid can all land on 6.61: that is not certainty.
    lo, hi = seed_band([6.61, 6.61, 6.61], resolution=0.05)
    half = 4.303 * 6.61 * 0.05 / math.sqrt(12) * math.sqrt(1 + 1 / 3)
    assert (lo, hi) == pytest.approx((6.61 - half, 6.61 + half))
    assert seed_band([6.61, 6.61, 6.61]) == (6.61, 6.61)  # without it, a zero-width band
