"""Prompt token draws made once per process (sim.workload._drawn): a search's runs share a seed and
vocabulary and drew the same tokens again each run. A Workload on a warm cache must give every
prompt a Workload on a cold one gives, and nothing it hands out may be the cache's own list."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim import workload as wl_mod
from twinserve.sim.config import WorkloadConfig
from twinserve.sim.workload import Workload


def _prompts(cfg: WorkloadConfig, seed: int, max_model_len: int) -> list[list[int]]:
    wl = Workload(cfg, seed, max_model_len)
    return [wl.prompt_tokens(item) for item in wl.items()]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 3), vocab=st.sampled_from([50, 32000, 128256]), n=st.integers(1, 600),
       mean=st.sampled_from([8, 64, 65, 300, 3000]), max_len=st.sampled_from([512, 4096]))
def test_prompts_on_warm_draws_are_the_prompts_on_cold_ones(seed, vocab, n, mean, max_len) -> None:
    cfg = WorkloadConfig(num_requests=n, vocab_size=vocab, prompt_dist="uniform", prompt_min=1,
                         prompt_max=min(mean * 2, max_len - 1), output_dist="fixed", output_mean=4)
    wl_mod._DRAWS.clear()
    cold = _prompts(cfg, seed, max_len)
    assert wl_mod._DRAWS  # the draws are kept
    warm = _prompts(cfg, seed, max_len)
    assert warm == cold
    for prompt in warm:  # handed-out lists are the caller's: changing one changes no later prompt
        prompt.append(-1)
        prompt[:] = [0] * len(prompt)
    assert _prompts(cfg, seed, max_len) == cold
    other = _prompts(cfg, seed + 7, max_len)
    assert other != cold or all(len(p) == 0 for p in cold)


def test_a_kept_draw_is_numpys_draw_and_the_oldest_goes_first(monkeypatch) -> None:
    monkeypatch.setattr(wl_mod, "_DRAWS_KEPT", 3)
    wl_mod._DRAWS.clear()
    for part in range(5):
        got = wl_mod._drawn(4, 13, part, 1000, (8, 64))
        assert got == np.random.default_rng([4, 13, part]).integers(2, 1000, (8, 64)).tolist()
    assert wl_mod._drawn(4, 17, None, 1000, 300) == \
        np.random.default_rng([4, 17]).integers(2, 1000, 300).tolist()
    assert len(wl_mod._DRAWS) == 3 and (4, 13, 0, 1000, (8, 64)) not in wl_mod._DRAWS
    assert wl_mod._drawn(5, 13, 4, 1000, (8, 64)) != wl_mod._drawn(4, 13, 4, 1000, (8, 64))
    assert max(map(max, wl_mod._drawn(4, 13, 4, 1000, (8, 64)))) < 1000
    assert max(map(max, wl_mod._drawn(4, 13, 4, 100000, (8, 64)))) >= 1000  # the vocabulary is in the key
    wl_mod._DRAWS.clear()
