"""`simulate validate --cost-model aic` with several workers: the parent loads each database's kernel
tables once before the workers fork, and the workers price from them (sim.validate.preload_aic). Before,
each worker loaded every database again (1.5-4.6 s each), and a worker replaced past its memory cap paid
them all once more: two workers were no faster than one (docs/validate-speed.md)."""

from __future__ import annotations

import multiprocessing
import os

import pandas as pd
import pytest

pytest.importorskip("aiconfigurator_core", reason="the measured backend is the extra 'aic'")

from aiconfigurator_core.sdk.engine import EngineHandle  # noqa: E402

import twinserve.backends.sim.aic.mapping as mapping  # noqa: E402
from twinserve.sim.cli import main  # noqa: E402

FLAGS = ["validate", "--silicon", "--cost-model", "aic", "--model", "Llama-3.1-70B", "--backend", "vllm",
         "--window", "steady", "--max-clients", "4", "--limit", "30"]


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="tables are shared by forking")
def test_workers_price_from_the_tables_their_parent_loaded(tmp_path, monkeypatch) -> None:
    log = tmp_path / "handles"
    made = EngineHandle.for_database.__func__

    def counted(cls, database, **kw):
        with open(log, "a") as f:  # the workers append here too
            f.write(f"{os.getpid()} {database.system}\n")
        return made(cls, database, **kw)
    monkeypatch.setattr(EngineHandle, "for_database", classmethod(counted))
    monkeypatch.setattr(mapping, "_EVALUATORS", {})  # as a fresh process: no table loaded yet
    assert main([*FLAGS, "--workers", "2", "--out", str(tmp_path / "two")]) == 0
    lines = [line.split() for line in log.read_text().splitlines()]
    two = pd.read_csv(tmp_path / "two" / "validation.csv")
    assert two["pred_tpot_ms"].notna().sum() >= 3 and two["system"].nunique() >= 2
    assert {pid for pid, _ in lines} == {str(os.getpid())}  # no worker made a handle (loaded tables) of its own
    assert len(lines) == len({system for _, system in lines})  # and this process made one a database
    # The same predictions as one process pricing everything itself.
    assert main([*FLAGS, "--workers", "1", "--out", str(tmp_path / "one")]) == 0
    one = pd.read_csv(tmp_path / "one" / "validation.csv")
    pd.testing.assert_series_equal(one["pred_tpot_ms"], two["pred_tpot_ms"])
    pd.testing.assert_series_equal(one["pred_ttft_ms"], two["pred_ttft_ms"])


def test_cost_models_on_one_database_share_its_loaded_tables(monkeypatch) -> None:
    # A handle per cost model let aic free a database's tables with each study; the next study on it
    # read them from disk again.
    from twinserve.backends.sim.aic import AicCostModel
    from twinserve.backends.sim.catalog import get_hardware, get_model

    made: list[str] = []
    real = EngineHandle.for_database.__func__

    def counted(cls, database, **kw):
        made.append(database.system)
        return real(cls, database, **kw)
    monkeypatch.setattr(EngineHandle, "for_database", classmethod(counted))
    monkeypatch.setattr(mapping, "_EVALUATORS", {})
    prices = []
    for tp, hw in ((1, "H100-SXM"), (2, "H100-SXM"), (1, "H200"), (1, "H100-SXM")):
        c = AicCostModel(get_model("Llama-3.1-8B"), get_hardware(hw), tp, "vllm")
        prices.append(c.tokens_time(256))
        del c
    assert sorted(made) == ["h100_sxm", "h200_sxm"]
    assert prices[0] == prices[3] and prices[0] > prices[1]  # the same table's answer; TP 2 splits the GEMMs


def test_a_kind_whose_first_row_cannot_be_built_is_preloaded_from_its_next(monkeypatch) -> None:
    import twinserve.sim.build as build_mod
    import twinserve.sim.study as study_mod
    import twinserve.sim.validate as validate

    built: list[str] = []

    def build(cfg):
        if cfg in ("a1", "b1", "b2", "b3"):
            raise ValueError(f"{cfg} does not fit")
        built.append(cfg)
    monkeypatch.setattr(validate, "row_study", lambda row, *a, **k: row["id"])
    monkeypatch.setattr(validate, "slice_row", lambda cfg, *a: (cfg, None))
    monkeypatch.setattr(study_mod, "is_cluster", lambda cfg: False)
    monkeypatch.setattr(build_mod, "build", build)
    monkeypatch.setattr(validate, "PRELOAD_TRIES", 3)
    kind = {"model": "m", "system": "s", "backend": "vllm", "backend_version": "1", "mode": "agg", "concurrency": 4}
    jobs = [({**kind, "id": "a1"}, "aic"), ({**kind, "id": "a2"}, "aic"), ({**kind, "id": "a3"}, "aic")]
    jobs += [({**kind, "system": "t", "id": f"b{i}"}, "aic") for i in range(1, 6)]
    assert validate.preload_aic(jobs) == 1
    assert built == ["a2"]  # a1 failed, a2 stands for its kind; b gives up after 3 rows (b4 never tried)
