"""Capacity-planning inputs through `simulate`: a model as a config.json or a [model] table, a GPU
as a [hardware] table, precision and engine profile by name; bad values exit 2 naming file,
line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from twinserve.backends.sim.hf_config import MODELS_DIR
from twinserve.sim import cli
from twinserve.sim.build import build
from twinserve.sim.config import load_config

RUN = '[workload]\nnum_requests = 12\nrate = 4.0\nprompt_dist = "uniform"\nprompt_min = 50\n' \
      'prompt_max = 200\noutput_dist = "uniform"\noutput_min = 5\noutput_max = 20\n'
HARDWARE = ('[hardware]\nname = "MyGPU"\npeak_flops = 500e12\npeak_flops_fp8 = 1000e12\n'
            'mem_bandwidth = 2.0e12\nmem_gib = 96\ninterconnect_bandwidth = 200e9\n'
            'interconnect_latency_s = 40e-6\nprice_per_hour = 1.25\nbase = "H100-SXM"\n')
MODEL = ('[model]\nname = "tiny-moe"\nnum_hidden_layers = 4\nhidden_size = 512\n'
         'num_attention_heads = 8\nnum_key_value_heads = 4\nvocab_size = 32000\n'
         'max_position_embeddings = 4096\nnum_experts = 8\nnum_experts_per_tok = 2\n'
         'moe_intermediate_size = 1024\n')


def _cli(args: list[str], capsys) -> tuple[int, str]:
    rc = cli.main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _study(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "study.toml"
    f.write_text(text)
    return f


def test_model_from_a_config_path_relative_to_the_study(tmp_path, capsys) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text((MODELS_DIR / "Qwen3-8B.json").read_text())
    f = _study(tmp_path, '[engine]\nmodel = "m"\nhardware = "H100-SXM"\n' + RUN)
    assert build(load_config(f)).model.num_params == pytest.approx(8.19e9, rel=0.01)
    rc, err = _cli(["run", "--config", str(f), "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err


def test_model_and_hardware_tables_define_a_study_alone(tmp_path, capsys) -> None:
    # A fixed pool: a tiny model on 96 GiB would make a million KV blocks per run.
    f = _study(tmp_path, "[engine]\nnum_gpu_blocks = 2000\n" + MODEL + HARDWARE + RUN)
    built = build(load_config(f))
    assert built.model.name == "tiny-moe" and built.model.is_moe
    assert built.hardware.name == "MyGPU" and built.hardware.profile.price_per_hour == 1.25
    assert built.hardware.profile.allreduce_latency_s == 40e-6
    assert built.hardware.profile.gemm == 0.62  # the base GPU's efficiencies
    out = tmp_path / "s"
    rc, err = _cli(["search", "--workers", "1", "--config", str(f), "--slo", "ttft_p99=2", "--set",
                    "requests_per_run=12", "--set", "max_requests_per_run=12", "--out", str(out)],
                   capsys)
    assert rc == 0, err
    assert pd.read_csv(out / "search.csv").loc[0, "usd_per_hour"] == 1.25  # the table's price


def test_precision_and_engine_profile_by_name_in_set_and_grid(tmp_path, capsys) -> None:
    f = _study(tmp_path, '[engine]\nmodel = "Llama-3.1-8B"\nhardware = "H100-SXM"\n' + RUN)
    rc, err = _cli(["sweep", "--workers", "1", "--config", str(f), "--grid", "quantization=none,fp8,int4",
                    "--set", "kv_cache_dtype=fp8", "--set", "engine_profile=cuda_graph_cpp",
                    "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err
    table = pd.read_csv(tmp_path / "o" / "summary.csv")
    # Lighter weights, quicker decode: each step down in bytes lowers the mean TPOT.
    tpot = list(table["mean_tpot_s"])
    assert tpot[0] > tpot[1] > tpot[2]
    cfg = load_config(f)
    cfg.engine.quantization, cfg.engine.kv_cache_dtype = "fp8", "fp8"
    cfg.engine.engine_profile = "cuda_graph_cpp"
    built = build(cfg)
    assert built.model.precision.kv_bytes == 1 and built.roofline.eff.step_overhead_s == 0.5e-3


@pytest.mark.parametrize("text, field, line", [
    (MODEL.replace("num_experts_per_tok = 2", "num_experts_per_tok = 9") + RUN,
     "model.num_experts_per_tok", 10),
    (MODEL.replace("hidden_size = 512", "hidden_size = 0") + RUN, "model.hidden_size", 4),
    (MODEL.replace("vocab_size = 32000\n", "") + RUN, "model.vocab_size", 1),
    (HARDWARE.replace("mem_bandwidth = 2.0e12", "mem_bandwidth = 0") + RUN,
     "hardware.mem_bandwidth", 5),
    (HARDWARE.replace("interconnect_bandwidth = 200e9", "interconnect_bandwidth = -1") + RUN,
     "hardware.interconnect_bandwidth", 7),
    (HARDWARE.replace('base = "H100-SXM"', 'base = "H1OO"') + RUN, "hardware.base", 10),
    ('[engine]\nquantization = "fp4"\n' + RUN, "engine.quantization", 2),
    ('[engine]\nengine_profile = "fast"\n' + RUN, "engine.engine_profile", 2),
])
def test_bad_model_hardware_or_precision_exits_2_naming_file_line_and_field(
        tmp_path, capsys, text: str, field: str, line: int) -> None:
    f = _study(tmp_path, text)
    rc, err = _cli(["run", "--config", str(f), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2
    assert f"{f}:{line}: field '{field}'" in err, err


def test_config_json_missing_a_field_exits_2_naming_its_line(tmp_path, capsys) -> None:
    cfg = json.loads((MODELS_DIR / "Llama-3.1-8B.json").read_text())
    del cfg["num_attention_heads"]
    cfg["num_hidden_layers"] = -2
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg, indent=2))
    f = _study(tmp_path, '[engine]\nmodel = "config.json"\n' + RUN)
    rc, err = _cli(["run", "--config", str(f), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2
    bad = next(i for i, s in enumerate(p.read_text().splitlines(), 1) if "num_hidden_layers" in s)
    assert f"{p}:{bad}: field 'num_hidden_layers'" in err, err
    f.write_text('[engine]\nmodel = "nowhere/config.json"\n' + RUN)
    rc, err = _cli(["run", "--config", str(f), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and f"{f}:2: field 'engine.model'" in err and "no such config.json" in err


def _gemma3_study(**fields) -> object:
    from .helpers import small_config

    base = dict(model="Gemma-3-27B", hardware="H200", max_model_len=8192, enable_prefix_caching=False,
                num_requests=60, arrival="all_at_once", prompt_dist="fixed", prompt_mean=4096,
                output_dist="fixed", output_mean=768, output_max=768)
    base.update(fields)
    return small_config(**base)


def test_a_gemma3_model_gets_the_engines_kv_groups_and_runs_more_requests_at_once() -> None:
    """Pages of one group's 2 layers (31 groups): the same memory holds more 4k-token requests."""
    from twinserve.backends.sim.capacity import model_kv_groups
    from twinserve.sim.build import build_engine
    from twinserve.sim.specs import resolve_model

    from .helpers import run

    groups_cfg, kept_cfg = _gemma3_study(), _gemma3_study(kv_groups="0")
    model = resolve_model(groups_cfg)
    windows = model_kv_groups(model)
    assert len(windows) == 31 and windows.count(0) == 5 and set(windows) == {0, 1024}
    grouped, kept = build_engine(groups_cfg), build_engine(kept_cfg)
    assert grouped.core.scheduler.kv.group_windows == tuple(w or None for w in windows)
    assert kept.core.scheduler.kv.num_groups == 1 and kept.core.scheduler.kv.sliding_window is None
    # The same bytes: a page is a 31st of a block of all 62 layers.
    assert grouped.capacity.block_bytes * 31 == kept.capacity.block_bytes
    assert abs(grouped.capacity.num_blocks - 31 * kept.capacity.num_blocks) <= 31
    a, b = run(groups_cfg), run(kept_cfg)
    # Groups hold all 60 requests of 4.9k tokens at once; keeping every block holds about half.
    assert max(a.steps.running) == 60 > 1.5 * max(b.steps.running)
    assert a.num_preemptions < b.num_preemptions
