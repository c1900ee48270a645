"""method = "draft_model" in the simulator: the draft's own forwards priced on top of each verify step,
its weights and KV taken from the pool, and the table's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinserve.sim.build import build, simulate
from twinserve.sim.config import from_dict, resolve_field, set_field
from twinserve.sim.errors import ConfigError

from .helpers import fingerprint, small_config

RATES = [0.8, 0.6, 0.5, 0.4]


def _small_draft(tmp_path: Path) -> str:
    """A 0.2B Llama with Llama-2's vocabulary, as a config.json."""
    path = tmp_path / "draft" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
        "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
        "num_key_value_heads": 16, "vocab_size": 32000, "max_position_embeddings": 4096}))
    return str(path)


def _draft_cfg(draft: str, rates=RATES, k: int = 4, **fields):
    cfg = small_config(**fields)
    set_field(cfg, "speculative.method", "draft_model")
    set_field(cfg, "speculative.draft_model", draft)
    set_field(cfg, "speculative.num_speculative_tokens", k)
    cfg.speculative.acceptance_rates = list(rates)
    return cfg


def _tpot(result) -> float:
    return sum((r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
               for r in result.records if r.num_output_tokens > 1)


def test_a_draft_costing_as_much_as_the_target_makes_speculation_lose_and_a_small_one_win(tmp_path: Path) -> None:
    plain = simulate(small_config(num_requests=40, rate=1.0))[1]
    small_built, small = simulate(_draft_cfg(_small_draft(tmp_path), num_requests=40, rate=1.0))
    self_built, same = simulate(_draft_cfg("Llama-2-7B", num_requests=40, rate=1.0))
    want = {r.request_id: r.num_output_tokens for r in plain.records}
    for r in (small, same):
        assert {x.request_id: x.num_output_tokens for x in r.records} == want
    assert _tpot(small) < _tpot(plain) < _tpot(same)
    # The draft's work is part of the step times, and a same-size draft's is most of the cost.
    assert 0 < small_built.simulation.executor.draft_time < self_built.simulation.executor.draft_time
    assert self_built.simulation.executor.draft_time > 0.3 * self_built.simulation.executor.totals.busy_time


def test_each_verify_step_adds_a_catch_up_and_k_minus_1_draft_decodes(tmp_path: Path) -> None:
    built = build(_draft_cfg(_small_draft(tmp_path), rates=[1.0] * 3, k=3, num_requests=1, rate=1.0))
    ex = built.simulation.executor
    inner = ex.draft.cost
    seen: list[tuple[int, int, int]] = []

    class Spy:
        name = "spy"

        def step_time(self, pt, ps, pc, pa, ds, dc):
            seen.append((pt, ps, ds))
            return inner.step_time(pt, ps, pc, pa, ds, dc)

    ex.draft.cost = Spy()
    built.simulation.run()
    # Prefill: the prompt plus the sampled token, then 2 decodes; each verify step with all 3
    # drafts accepted catches up 1 + 3 + 1 tokens, then 2 decodes.
    assert seen[1:3] == [(0, 0, 1), (0, 0, 1)]
    verify = seen[3:-3]
    assert verify and all(verify[i:i + 3] == [(5, 1, 0), (0, 0, 1), (0, 0, 1)] for i in range(0, len(verify), 3))


def test_the_draft_takes_its_weights_and_kv_from_the_pool(tmp_path: Path) -> None:
    plain = build(small_config(num_requests=1)).capacity
    cap = build(_draft_cfg(_small_draft(tmp_path), num_requests=1)).capacity
    assert cap.block_bytes > plain.block_bytes
    assert cap.num_blocks < plain.num_blocks
    assert cap.weight_bytes > plain.weight_bytes


@pytest.mark.parametrize("table, match", [
    ({"method": "draft_model", "acceptance_rates": [0.5] * 4}, "needs the draft"),
    ({"method": "draft_model", "draft_model": "Llama-3-8B", "acceptance_rates": [0.5] * 4}, "vocabulary"),
    ({"method": "draft_model", "draft_model": "Llama-2-70B", "acceptance_rates": [0.5] * 4}, "larger than the target"),
    ({"method": "draft_model", "draft_model": "no-such-model", "acceptance_rates": [0.5] * 4}, "no-such-model"),
], ids=["missing", "vocab", "larger", "unknown"])
def test_a_bad_draft_names_speculative_draft_model(table: dict, match: str) -> None:
    with pytest.raises(ConfigError) as e:
        cfg = from_dict({"engine": {"model": "Llama-2-7B", "hardware": "A100-80GB"}, "speculative": table})
        build(cfg)
    assert "speculative.draft_model" in str(e.value) and match in str(e.value)


def test_sweeps_set_the_draft_model_and_its_k(tmp_path: Path) -> None:
    assert resolve_field("draft_model") == "speculative.draft_model"
    cfg = _draft_cfg("Llama-2-7B", num_requests=2)
    set_field(cfg, "draft_model", _small_draft(tmp_path))  # as a --grid value arrives
    set_field(cfg, "num_speculative_tokens", "2")
    built = build(cfg)
    assert built.simulation.executor.draft.num_speculative_tokens == 2
    assert built.simulation.executor.draft.cost.model.hidden_size == 1024
    grid = from_dict({"search": {"grid": {"speculative.draft_model": ["Llama-2-7B", "x/config.json"],
                                          "num_speculative_tokens": [2, 4]}}}).search.grid
    assert grid == {"speculative.draft_model": ["Llama-2-7B", "x/config.json"],
                    "speculative.num_speculative_tokens": ["2", "4"]}


def test_fast_forward_prices_the_drafts_catch_up_as_stepping_does(tmp_path: Path) -> None:
    # disable_by_batch_size = 1: no drafts, so decode runs fast-forward, yet the draft still catches up.
    cfg = _draft_cfg(_small_draft(tmp_path), num_requests=30, rate=5.0)
    set_field(cfg, "speculative.disable_by_batch_size", 1)
    built, ff = simulate(cfg)
    assert built.simulation.num_ff_windows > 0
    set_field(cfg, "run.fast_forward", False)
    assert fingerprint(simulate(cfg)[1]) == fingerprint(ff)
    plain = simulate(small_config(num_requests=30, rate=5.0))[1]
    assert _tpot(ff) > _tpot(plain)  # the catch-up is not free
