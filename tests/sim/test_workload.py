"""Arrivals, lengths, trace loading with over-long policies, multi-turn contexts, typed errors."""

from __future__ import annotations

import numpy as np
import pytest

from twinserve.sim.build import BUILTIN_TRACES, build
from twinserve.sim.config import StudyConfig, load_config
from twinserve.sim.errors import ConfigError, TraceError
from twinserve.sim.traces import LengthStats, fit_lengths, read_trace
from twinserve.sim.workload import Workload, WorkloadConfig

from .helpers import run, small_config


def _arrivals(**kw) -> np.ndarray:
    cfg = WorkloadConfig(num_requests=4000, **kw)
    return np.array([i.arrival_time for i in Workload(cfg, seed=3).items()])


def test_arrival_processes() -> None:
    gaps = np.diff(_arrivals(arrival="poisson", rate=5.0))
    assert gaps.mean() == pytest.approx(0.2, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.08)
    bursty = np.diff(_arrivals(arrival="gamma", rate=5.0, burstiness=0.25))
    assert bursty.mean() == pytest.approx(0.2, rel=0.1)
    assert (bursty.std() / bursty.mean()) ** 2 == pytest.approx(4.0, rel=0.2)  # CV² = 1/shape
    assert np.allclose(np.diff(_arrivals(arrival="fixed", rate=4.0)), 0.25)
    assert not _arrivals(arrival="all_at_once").any()


def test_trace_timestamps_and_time_scale() -> None:
    path = str(BUILTIN_TRACES["azure_conv"])
    rows = list(read_trace(path, limit=5))
    assert rows[0].arrival_time == 0.0
    assert rows[1].arrival_time == pytest.approx(50.9951690 - 46.6805900)
    assert (rows[0].num_prompt_tokens, rows[0].num_output_tokens) == (374, 44)
    cfg = WorkloadConfig(num_requests=5, arrival="trace", time_scale=0.5, prompt_dist="trace",
                         output_dist="trace", trace=path)
    items = list(Workload(cfg).items())
    assert [i.arrival_time for i in items] == pytest.approx([r.arrival_time * 0.5 for r in rows])


def test_length_distributions_are_clipped() -> None:
    for dist in ("normal", "lognormal", "uniform"):
        cfg = WorkloadConfig(num_requests=2000, prompt_dist=dist, prompt_mean=500, prompt_std=400,
                             prompt_min=100, prompt_max=900)
        p = np.array([i.num_prompt_tokens for i in Workload(cfg).items()])
        assert p.min() >= 100 and p.max() <= 900
        assert 350 < p.mean() < 650


def test_overlong_policies_are_explicit_and_counted(tmp_path) -> None:
    stats = LengthStats("clip", 4096)
    assert fit_lengths(4000, 500, 4096, "clip", stats) == (4000, 96)
    assert fit_lengths(5000, 10, 4096, "clip", stats) == (4095, 1)
    assert stats.clipped == 2
    assert fit_lengths(4000, 500, 4096, "drop", stats) is None and stats.dropped == 1
    f = tmp_path / "t.csv"
    f.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n100,10,0\n4000,200,1.5\n")
    with pytest.raises(TraceError, match=r"t\.csv:3:.*on_overlong"):
        list(Workload(WorkloadConfig(arrival="trace", prompt_dist="trace", output_dist="trace",
                                     on_overlong="fail"), trace_path=str(f)).items())
    wl = Workload(WorkloadConfig(arrival="trace", prompt_dist="trace", output_dist="trace",
                                 on_overlong="drop"), trace_path=str(f))
    assert [i.arrival_time for i in wl.items()] == [0.0]
    assert wl.length_stats.dropped == 1


@pytest.mark.parametrize("body, line, column", [
    ("num_prefill_tokens,num_decode_tokens\n10,5\n12,x\n", 3, "num_decode_tokens"),
    ("num_prefill_tokens,num_decode_tokens\n10,5\n0,4\n", 3, "num_prefill_tokens"),
    ("num_prefill_tokens,num_decode_tokens\n10,5\n\n12\n", 4, None),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\nyesterday,3,4\n", 3,
     "TIMESTAMP"),
])
def test_malformed_trace_row_names_file_and_line(tmp_path, body: str, line: int,
                                                 column: str | None) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(body)
    with pytest.raises(TraceError) as err:
        list(read_trace(f))
    assert err.value.line == line and err.value.field == column
    assert f"bad.csv:{line}:" in str(err.value)


def test_bad_config_field_names_field_file_and_line(tmp_path) -> None:
    f = tmp_path / "study.toml"
    f.write_text('[engine]\nmodel = "Llama-2-7B"\n\n[scheduler]\nblock_size = 16\n'
                 'max_num_batched_tokens = "lots"\n')
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert (err.value.field, err.value.line) == ("scheduler.max_num_batched_tokens", 6)
    assert "study.toml:6:" in str(err.value)
    f.write_text('[workload]\nrate = 2.0\nburstyness = 0.5\n')
    with pytest.raises(ConfigError, match=r"study\.toml:3: field 'workload\.burstyness'"):
        load_config(f)
    f.write_text('[scheduler]\nmax_num_seqs = 0\n')
    with pytest.raises(ConfigError, match=r"study\.toml:2: field 'scheduler\.max_num_seqs'"):
        load_config(f)
    f.write_text('[engine]\nmodel = "Llama-9"\n')
    with pytest.raises(ConfigError, match=r"study\.toml:2: field 'engine\.model'.*Llama-2-7B"):
        build(load_config(f))
    f.write_text('[workload]\narrival = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"study\.toml:2: .*poisson"):
        load_config(f)


def test_config_defaults_and_relative_trace(tmp_path) -> None:
    (tmp_path / "tr.csv").write_text("num_prefill_tokens,num_decode_tokens\n50,5\n60,6\n")
    f = tmp_path / "s.toml"
    f.write_text('[workload]\ntrace = "tr.csv"\nprompt_dist = "trace"\noutput_dist = "trace"\n'
                 'num_requests = 2\n')
    cfg = load_config(f)
    assert cfg.scheduler.block_size == StudyConfig().scheduler.block_size
    res = build(cfg).simulation.run()
    assert sorted(r.num_prompt_tokens for r in res.records) == [50, 60]


def test_multi_turn_next_turn_extends_previous_context() -> None:
    cfg = small_config(turns=3, think_time=1.0, num_requests=10, rate=1.0, output_mean=30,
                       prompt_mean=200)
    built = build(cfg)
    seen: dict[str, list[int]] = {}
    orig = built.workload.prompt_tokens

    def spy(item):
        toks = orig(item)
        seen[item.request_id] = list(toks)  # the request takes the list over (Request.owning)
        return toks

    built.workload.prompt_tokens = spy  # type: ignore[method-assign]
    res = built.simulation.run()
    by_id = {r.request_id: r for r in res.records}
    follow = [r for r in res.records if r.turn > 0]
    assert follow
    for r in follow:
        prev = by_id[f"c{r.conversation}-t{r.turn - 1}"]
        ctx = prev.num_prompt_tokens + prev.num_output_tokens
        assert seen[r.request_id][:ctx][:prev.num_prompt_tokens] == seen[prev.request_id]
        assert r.arrival_time >= prev.finish_time
        # The whole previous context is cached, so the follow-up hits most of it.
        assert r.prefix_hit_tokens >= (ctx // 16 - 1) * 16


def _token_items(n: int, **kw) -> tuple[WorkloadConfig, list]:
    cfg = WorkloadConfig(num_requests=n, prompt_dist="uniform", prompt_min=1, prompt_max=3000,
                         vocab_size=1000, **kw)
    return cfg, list(Workload(cfg, seed=5, max_model_len=4096).items())


def test_fresh_prompt_tokens_are_keyed_by_request_not_by_call_order() -> None:
    # 600 requests span three draw chunks, and asking in reverse order makes each chunk be
    # drawn again after it has left the workload's small cache of chunks.
    cfg, items = _token_items(600)
    forward = Workload(cfg, seed=5, max_model_len=4096)
    backward = Workload(cfg, seed=5, max_model_len=4096)
    a = {it.request_id: forward.prompt_tokens(it) for it in items}
    b = {it.request_id: backward.prompt_tokens(it) for it in reversed(items)}
    b.update((it.request_id, backward.prompt_tokens(it)) for it in items[::7])  # asked again
    assert a == b
    other_seed = Workload(cfg, seed=6, max_model_len=4096)
    assert other_seed.prompt_tokens(items[0]) != a[items[0].request_id]
    for it in items:
        toks = a[it.request_id]
        assert len(toks) == it.num_prompt_tokens
        assert all(type(t) is int and 2 <= t < cfg.vocab_size for t in toks)


def test_fresh_prompt_tokens_share_no_leading_run_across_requests() -> None:
    # Each request's first 64 fresh ids are its own uniform draws: with a vocabulary of
    # 1,000, no two of 600 requests share their first three ids (a shared run of ids, the
    # bug this guards against, would make every prompt a prefix of the longer ones).
    cfg, items = _token_items(600)
    wl = Workload(cfg, seed=5, max_model_len=4096)
    heads = [tuple(wl.prompt_tokens(it)[:3]) for it in items if it.num_prompt_tokens >= 3]
    assert len(set(heads)) == len(heads)
    # Within a request the ids vary too (an id repeated over a whole prompt would not do
    # for a real engine fed the same workload).
    long = next(it for it in items if it.num_prompt_tokens > 1000)
    toks = wl.prompt_tokens(long)
    assert len(set(toks[:64])) > 50 and len(set(toks[64:])) > 500


def test_fresh_prompt_tokens_do_not_depend_on_the_lengths_asked_before() -> None:
    cfg, items = _token_items(50)
    short_first = Workload(cfg, seed=5, max_model_len=100)  # shared run drawn short, then grown
    long_first = Workload(cfg, seed=5, max_model_len=4096)
    order = sorted(items, key=lambda it: it.num_prompt_tokens)
    a = {it.request_id: short_first.prompt_tokens(it) for it in order}
    b = {it.request_id: long_first.prompt_tokens(it) for it in reversed(order)}
    assert a == b
