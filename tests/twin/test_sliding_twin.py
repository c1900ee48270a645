"""The twin on a sliding-window model: calibrate and fidelity end to end on a tiny Gemma 3, the
window carried from the served model's config into the profile and the forecast, and a profile
made for another window refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from twinserve.backends.sim.catalog import catalog_name, get_model
from twinserve.backends.sim.cost_model import sliding_pairs
from twinserve.backends.sim.fit import fit_step_profile
from twinserve.backends.sim.fitted import FittedCostModel, ProfileError

from ..real.arch_helpers import WINDOW, make_arch_dir

TRACE = [(0.0, 30, 6), (0.01, 12, 9), (0.03, 44, 4), (0.05, 20, 7), (0.08, 9, 12), (0.1, 36, 5)]
ARCHS = ["MistralForCausalLM", "Qwen2ForCausalLM", "Gemma3ForCausalLM", "LlamaForCausalLM"]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Gemma 3: layers 0, 1 and 3 slide over WINDOW tokens, layer 2 is global."""
    return make_arch_dir(tmp_path_factory.mktemp("twin_gemma3"), "Gemma3ForCausalLM")


@pytest.mark.slow
def test_calibrate_then_fidelity_on_a_sliding_window_model(gemma_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from twinserve.cli import main

    common = ["--model", str(gemma_dir), "--dtype", "float32", "--max-model-len", "256",
              "--block-size", "4", "--num-gpu-blocks-override", "200"]
    prof = tmp_path / "g3.json"
    assert main(["calibrate", "--out", str(prof), "--quick", "--repeats", "1", "--no-progress",
                 "--max-context", "100", "--probe-every", "6", *common]) == 0
    data = json.loads(prof.read_text())
    # Named by its folder (no catalog model has its shape), with its window and sliding layers.
    assert data["model"] == gemma_dir.name
    assert data["attention"] == {"sliding_window": WINDOW, "num_sliding_layers": 3, "num_layers": 4}
    # The design reached far past the window, so the window shaped the fit.
    assert data["fit"]["range"]["decode_context_per_seq"] > 4 * WINDOW
    profile = FittedCostModel.load(prof)
    assert (profile.sliding_window, profile.sliding_share) == (WINDOW, 0.75)
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{a},{p},{d}\n" for a, p, d in TRACE))
    out = tmp_path / "fid"
    assert main(["fidelity", "--profile", str(prof), "--trace", str(trace), "--out", str(out),
                 "--repeats", "2", *common]) == 0
    fc = json.loads((out / "forecast.json").read_text())
    spec = fc["engine"]["model_spec"]
    assert (spec["sliding_window"], spec["num_sliding_layers"], spec["num_layers"]) == (WINDOW, 3, 4)
    assert spec["name"] == fc["engine"]["model"] == data["model"]
    assert fc["num_requests"] == len(TRACE)
    rep = json.loads((out / "fidelity.json").read_text())
    assert rep["repeats"]["count"] == 2
    verdicts = [cell["verdict"]["state"] for per in rep["metrics"].values() for q, cell in per.items()
                if q != "p99"]
    assert len(verdicts) == 8 and set(verdicts) <= {"PASS", "FAIL", "UNRESOLVED"}
    assert sum(rep["summary"][k] for k in ("pass", "fail", "unresolved")) == rep["summary"]["cells"] == 8
    capsys.readouterr()
    # The same profile said to be made on a full-attention model prices this one's long contexts
    # wrong: refused before anything loads, naming both.
    data["attention"] = {"sliding_window": 0, "num_sliding_layers": 0, "num_layers": 4}
    full = tmp_path / "full.json"
    full.write_text(json.dumps(data))
    assert main(["fidelity", "--profile", str(full), "--trace", str(trace), "--out", str(tmp_path / "o"),
                 *common]) == 2
    err = capsys.readouterr().err
    assert "full attention" in err and f"a {WINDOW}-token window on 3 of 4 layers" in err
    assert not (tmp_path / "o").exists()


def test_a_profile_without_an_attention_record_is_a_full_attention_one(gemma_dir: Path) -> None:
    from twinserve.backends.real.config import EngineArgs
    from twinserve.twin.preflight import engine_facts, mismatches

    facts = engine_facts(EngineArgs(model=str(gemma_dir), dtype="float32", max_model_len=256))
    assert facts.attention == {"sliding_window": WINDOW, "num_sliding_layers": 3, "num_layers": 4}
    old = FittedCostModel(intercept_s=0.01, meta={"model": facts.model})
    assert any("full attention" in m and "3 of 4 layers" in m for m in mismatches(old, facts))
    same = FittedCostModel(intercept_s=0.01, meta={"model": facts.model, "attention": facts.attention})
    assert mismatches(same, facts) == []


@pytest.mark.parametrize("arch", ARCHS)
def test_the_served_spec_has_the_window_the_simulators_config_reader_finds(arch: str, tmp_path: Path) -> None:
    # Two readers of one config.json: the engine's (which layers it runs sliding) and the
    # simulator's (which prices them). They must agree on what slides.
    from twinserve.backends.real.models.loader import read_hf_config
    from twinserve.backends.sim.hf_config import load_hf_config
    from twinserve.twin.preflight import served_model_spec

    folder = make_arch_dir(tmp_path / arch, arch)
    engine, sim = served_model_spec(read_hf_config(folder), folder.name), load_hf_config(folder)
    keys = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
            "vocab_size", "sliding_window", "num_sliding_layers", "tie_word_embeddings")
    assert {k: getattr(engine, k) for k in keys} == {k: getattr(sim, k) for k in keys}
    assert (engine.sliding_window > 0) == (arch != "LlamaForCausalLM")


def test_catalog_name_finds_shipped_configs_and_tells_windows_apart() -> None:
    from dataclasses import replace

    gemma = get_model("Gemma-3-27B")  # a shipped config file, not a built-in spec
    assert catalog_name(replace(gemma, name="my-gemma")) == "Gemma-3-27B"
    # The same shape without its window is another model for the twin: its name is its own.
    assert catalog_name(replace(gemma, name="my-gemma", sliding_window=0, num_sliding_layers=0)) == "my-gemma"
    assert catalog_name(replace(get_model("SmolLM2-135M"), name="folder")) == "SmolLM2-135M"


def _rows(window: int, rng: np.random.Generator) -> list[dict[str, float]]:
    """Decode, prefill and mixed steps timed as an engine whose every layer slides over `window`.

    A step's decodes are all inside the window or all past it: the features are sums over a
    step's requests, and the cap of a sum is the sum of the caps only then."""
    rows = []
    for _ in range(200):
        ds, pt = int(rng.integers(0, 12)), int(rng.choice([0, 0, 16, 64, 200]))
        ps = 1 if pt else 0
        pc = int(rng.integers(0, 4 * window)) if pt else 0
        ctx = rng.integers(1, window + 1, ds) if rng.random() < 0.3 else rng.integers(window, 8 * window, ds)
        pa = pt * (pc + pt / 2)
        if ds + pt == 0:
            continue
        t = (1e-3 + 2e-5 * (pt + ds) + 4e-8 * sliding_pairs(pt, ps, pc, pa, window) + 3e-6 * float(np.minimum(ctx, window).sum()))
        rows.append({"num_prefill_tokens": pt, "num_prefill_seqs": ps, "prefill_context": pc,
                     "prefill_attn": pa, "num_decode_seqs": ds, "decode_context": int(ctx.sum()),
                     "step_time_s": t * float(rng.normal(1.0, 0.01))})
    return rows


def test_the_fit_with_the_window_recovers_what_the_window_costs() -> None:
    window = 32
    rows = _rows(window, np.random.default_rng(0))
    att = {"sliding_window": window, "num_sliding_layers": 2, "num_layers": 2}
    windowed = fit_step_profile(rows, split=False, attention=att)
    plain = fit_step_profile(rows, split=False)
    assert windowed.meta["fit"]["mape"] < 0.01  # the 1% noise
    assert plain.meta["fit"]["mape"] > 2 * windowed.meta["fit"]["mape"]
    assert windowed.per_decode_context_token_s == pytest.approx(3e-6, rel=0.05)
    # A decode past the window costs what one at the window does; without the record it grows.
    at, far = (0, 0, 0, 0.0, 4, 4 * window), (0, 0, 0, 0.0, 4, 4 * 10 * window)
    assert windowed.step_time(*far) == windowed.step_time(*at)
    assert plain.step_time(*far) > plain.step_time(*at)
    # The record survives the file, and prices the same.
    back = FittedCostModel.from_dict(windowed.to_dict())
    assert back.step_time(*far) == windowed.step_time(*far) and back.sliding_share == 1.0


@pytest.mark.parametrize("att, field", [({"sliding_window": -1, "num_sliding_layers": 0, "num_layers": 2}, "sliding_window"),
                                        ({"sliding_window": 8, "num_sliding_layers": 3, "num_layers": 2}, "attention"),
                                        ({"sliding_window": 8, "num_sliding_layers": 0, "num_layers": 2}, "attention"),
                                        ({"sliding_window": 8, "num_sliding_layers": 1}, "num_layers"),
                                        ("8", "attention")])
def test_a_bad_attention_record_is_refused_by_name(att: object, field: str) -> None:
    data = FittedCostModel(intercept_s=0.01).to_dict() | {"attention": att}
    with pytest.raises(ProfileError, match=f"field 'attention{'.' + field if field != 'attention' else ''}"):
        FittedCostModel.from_dict(data, "p.json")
