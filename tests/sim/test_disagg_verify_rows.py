"""A disaggregated decode replica prices its verify rows as its cost model does on one replica (sim/disagg.py
_Discounted forwards prices_verify and verify_time): under aic, k + 1 decode rows on the generation graph, whose
DeepSeek MoE block runs the shared expert beside the routed experts (TensorRT-LLM's Deepseekv3MoE on its
MoeShared aux stream inside the captured decode graph), not a (k + 1)-token chunk on the context graph."""

from __future__ import annotations

import pytest

from twinserve.backends.sim.cost_model import RooflineCostModel
from twinserve.sim.disagg import _Discounted


class _VerifyPricer:
    """A cost model that prices verify rows as decode rows plus a fixed term (as a verify-fitted profile)."""

    prices_verify = True

    def step_time(self, pt, ps, pc, pa, ds, dc):
        return 1e-3 * (pt + ds)

    def verify_time(self, num_spec_reqs: int, num_draft_tokens: int) -> float:
        return 1e-4 * num_spec_reqs + 1e-5 * num_draft_tokens


def test_the_wrapper_keeps_the_inner_models_verify_pricing() -> None:
    d = _Discounted(_VerifyPricer())
    assert d.prices_verify is True
    assert d.verify_time(4, 12) == pytest.approx(4e-4 + 12e-5)
    assert _Discounted(object.__new__(RooflineCostModel)).prices_verify is False


def _dsr1_fp4_gb200_disagg(clients: int = 8):
    """DeepSeek-R1 NVFP4 on GB200, TensorRT-LLM tables: 1 prefill and 1 decode replica (TP 8, EP 8), MTP 3."""
    from twinserve.backends.sim.aic_models import resolve_row_model
    from twinserve.sim.config import StudyConfig, set_field
    from twinserve.sim.specs import MTP_DRAFT
    cfg = StudyConfig()
    cfg.custom_model = resolve_row_model("deepseek-ai/DeepSeek-R1")
    e = cfg.engine
    e.model, e.hardware, e.cost_model, e.aic_backend = cfg.custom_model.name, "GB200", "aic", "trtllm"
    e.tensor_parallel_size, e.expert_parallel_size, e.quantization, e.kv_cache_dtype = 8, 8, "nvfp4", "fp8"
    cfg.speculative.method, cfg.speculative.draft_model = "draft_model", MTP_DRAFT
    cfg.speculative.num_speculative_tokens, cfg.speculative.acceptance_rates = 3, [0.8, 0.6, 0.4]
    for name, value in dict(concurrency=clients, num_requests=3 * clients, warmup_requests=0, num_replicas=2,
                            num_prefill_replicas=1, seed=5, max_model_len=2048, prompt_dist="fixed",
                            prompt_mean=1024, output_dist="fixed", output_mean=64, disagg_join_row="decode",
                            max_num_seqs=clients).items():
        set_field(cfg, name, value)
    return cfg


def test_a_decode_worker_prices_verify_rows_on_the_generation_graph() -> None:
    """Every step of the decode replica's target is priced on aic's generation graph (decode_tokens_time), most
    of them k + 1 rows a sequence: the verify rows. Its MoE block there is aic's Overlap, priced at the slower of
    the routed side and the shared expert, below their sum. Before, each verifying sequence was a 4-token prefill
    chunk on the context graph (tokens_time: the shared expert after the routed experts)."""
    pytest.importorskip("aiconfigurator_core")
    import json

    from twinserve.backends.sim.aic import AicCostModel
    from twinserve.sim.cluster_study import simulate_cluster
    cfg = _dsr1_fp4_gb200_disagg()
    graphs: list[tuple[int, str, int]] = []  # (cost model, graph, rows) of each target stage priced
    real = AicCostModel.stage_time

    def spy(self, pt, ps, pc, ds, dc):
        if self.model.num_layers > 1:  # the target, not its one-layer MTP draft
            graphs.append((id(self), "context" if pt else "generation", pt + ds))
        return real(self, pt, ps, pc, ds, dc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AicCostModel, "stage_time", spy)
        built, res = simulate_cluster(cfg)
    assert len(res.total.records) == 24
    c = built.engines[1].cost_model
    assert c.prices_verify
    steps = [(g, rows) for who, g, rows in graphs if who == id(c)]
    # Joiners are decode rows too (disagg_join_row "decode"): no step of this replica has prefill tokens.
    assert steps and {g for g, _ in steps} == {"generation"}
    verify = [rows for _, rows in steps if rows % 4 == 0]
    assert len(verify) > len(steps) / 2
    overlap = [op for op in json.loads(c.graph.decode_tokens) if next(iter(op)) == "Overlap"]
    assert len(overlap) == 1
    block = overlap[0]["Overlap"]
    kw = dict(is_context=True, batch_size=1, s=1, x=max(verify))
    routed = sum(r[1] for r in c._eval(json.dumps(block["group_a"]), **kw))
    shared = sum(r[1] for r in c._eval(json.dumps(block["group_b"]), **kw))
    whole = sum(r[1] for r in c._eval(json.dumps(overlap), **kw))
    assert whole == pytest.approx(max(routed, shared), rel=1e-9) and whole < routed + shared
