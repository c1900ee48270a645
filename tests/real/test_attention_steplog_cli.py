"""Torch paged attention against the kernels' reference, the step log, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinserve.backends.real import SamplingParams
from twinserve.backends.real.attention import AttentionMetadata, TorchPagedAttention, get_attention_backend
from twinserve.core.errors import InvalidConfigError, UnsupportedModelError
from twinserve.kernels.reference import ref_paged_attention


def _mixed_batch(seed: int, block_size: int = 4, hq: int = 6, hkv: int = 2, d: int = 8):
    g = torch.Generator().manual_seed(seed)
    # (query_len, context_len): decodes of varied context first (as the runner orders them), then
    # a pure prefill, a chunk with cached context and a one-block prefix hit.
    shapes = [(1, 0), (1, 5), (1, 13), (1, 30)] + [(1, c) for c in range(2, 40, 3)] + [(7, 0), (5, 9), (3, 4)]
    num_blocks = 200
    perm = torch.randperm(num_blocks, generator=g)  # shuffled, non-contiguous block tables
    kc = torch.randn(num_blocks, block_size, hkv, d, generator=g, dtype=torch.float64)
    vc = torch.randn(num_blocks, block_size, hkv, d, generator=g, dtype=torch.float64)
    max_blocks = max(-(-(q + c) // block_size) for q, c in shapes)
    tables, slots, used = torch.zeros(len(shapes), max_blocks, dtype=torch.int32), [], 0
    for i, (q, c) in enumerate(shapes):
        n = -(-(q + c) // block_size)
        tables[i, :n] = perm[used:used + n]
        used += n
        for pos in range(c, c + q):
            slots.append(int(tables[i, pos // block_size]) * block_size + pos % block_size)
    qlens = [q for q, _ in shapes]
    seq = [q + c for q, c in shapes]
    qsl = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    t = qsl[-1].item()
    meta = AttentionMetadata(t, sum(1 for q in qlens if q == 1), qsl, torch.tensor(seq, dtype=torch.int32), tables,
                             torch.tensor(slots), max(qlens), max(seq), qlens, seq)
    q = torch.randn(t, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(t, hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(t, hkv, d, generator=g, dtype=torch.float64)
    return q, k, v, kc, vc, meta, block_size


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gather_bytes", [None, 1, 3000])
def test_torch_paged_attention_matches_reference(seed: int, gather_bytes: int | None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from twinserve.backends.real.attention import torch_paged as tp

    if gather_bytes is not None:  # decode buckets attended one sequence, or a few, at a time
        monkeypatch.setattr(tp, "_GATHER_BYTES", gather_bytes)
    q, k, v, kc, vc, meta, bs = _mixed_batch(seed)
    backend = TorchPagedAttention()
    backend.plan(meta, bs, kc.shape[2])
    kc2, vc2 = kc.clone(), vc.clone()
    out = backend.forward(q, k, v, kc, vc, meta, 0.3)
    # The reference expects the new K/V already stored; store them the plain way.
    flat_k, flat_v = kc2.view(-1, *kc2.shape[2:]), vc2.view(-1, *vc2.shape[2:])
    flat_k[meta.slot_mapping] = k
    flat_v[meta.slot_mapping] = v
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    ref = ref_paged_attention(q, kc2, vc2, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.3,
                              meta.max_query_len, meta.max_seq_len)
    # The reference computes in fp32 whatever the input dtype.
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_backend_selection() -> None:
    assert get_attention_backend("auto", torch.device("cpu")).name == "torch"
    with pytest.raises(InvalidConfigError, match="attention_backend"):
        get_attention_backend("flash", torch.device("cpu"))


def test_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    from twinserve.backends.real.models.registry import resolve_model

    with pytest.raises(UnsupportedModelError, match="unknown model"):
        resolve_model("no-such-model")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    from twinserve.backends.real.models.loader import read_hf_config

    with pytest.raises(UnsupportedModelError, match="gpt2"):
        read_hf_config(tmp_path)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_step_log_records_shapes_and_times(make_llm, tmp_path: Path, suffix: str) -> None:
    from twinserve.backends.real.step_log import read_step_log

    path = tmp_path / f"steps{suffix}"
    llm = make_llm(max_num_batched_tokens=10, step_log_path=str(path))
    prompts = [{"prompt_token_ids": [5] * 23}, {"prompt_token_ids": [6] * 14}]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    engine = llm.llm_engine
    assert engine.step_log.records == []  # streamed to the file, not kept in memory
    engine.shutdown()
    rows = read_step_log(path)
    assert len(rows) == engine.core.num_steps
    tokens = [r["num_prefill_tokens"] + r["num_decode_seqs"] for r in rows]
    assert sum(tokens) == 23 + 14 + 2 * 4  # the last sampled token is never fed
    assert all(0 < t <= 10 for t in tokens)
    chunks = [tuple(qc) for r in rows for qc in r["prefill_chunks"]]
    assert sum(q for q, _ in chunks) == sum(r["num_prefill_tokens"] for r in rows) >= 23 + 14
    assert any(c > 0 for _, c in chunks)  # a chunk with cached context
    assert any(r["num_decode_seqs"] and r["num_prefill_seqs"] for r in rows)  # a mixed step
    for r in rows:
        # Features are what the simulator prices: check them against the chunk lists.
        assert r["prefill_attn"] == pytest.approx(sum(q * (c + q / 2) for q, c in r["prefill_chunks"]))
        assert r["decode_context"] == sum(r["decode_context_lens"])
        phases = [r[k] for k in ("schedule_s", "prepare_s", "forward_s", "sample_s", "update_s", "output_s")]
        assert all(p >= 0 for p in phases) and r["forward_s"] > 0 and r["schedule_s"] > 0
        assert r["step_time_s"] >= sum(phases) * 0.999  # the whole step, not just the forward
        assert r["execute_s"] == pytest.approx(r["prepare_s"] + r["forward_s"] + r["sample_s"])


def test_step_log_off_keeps_and_times_nothing(make_llm) -> None:
    llm = make_llm()
    engine = llm.llm_engine
    assert not engine.step_log.enabled and engine.core.clock is None and not engine.worker.runner.timing
    llm.generate([{"prompt_token_ids": [5] * 9}], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert engine.step_log.records == [] and engine.step_log.num_records == 0
    assert engine.last_stats is not None and engine.last_stats.schedule_time == 0.0


def test_cli_generate(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from twinserve.cli import main

    rc = main(["generate", "the quick", "brown fox", "--model", str(tiny_dir), "--dtype", "float64",
               "--max-tokens", "5", "--max-model-len", "128", "--num-gpu-blocks-override", "64", "--json",
               "--no-enable-prefix-caching", "--threads", "1"])
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["prompt"] for x in lines] == ["the quick", "brown fox"]
    assert all(len(x["token_ids"]) <= 5 and x["finish_reason"] in ("stop", "length") for x in lines)
    assert main(["generate", "x", "--model", "no-such-model"]) == 2


@pytest.mark.parametrize("seed", range(20))
def test_decode_buckets_bound_padding(seed: int) -> None:
    """Padding to a bucket's longest context stays small, so attention cost follows the sum of
    context lengths (what the simulator prices), with a bounded number of buckets."""
    from twinserve.backends.real.attention import torch_paged as tp

    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 64, (1,), generator=g))
    lens = sorted(torch.randint(1, 2000, (n,), generator=g).tolist())
    buckets = tp._buckets(lens)
    assert buckets[0][0] == 0 and buckets[-1][1] == n
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(buckets, buckets[1:]))
    assert len(buckets) <= tp._MAX_DECODE_BUCKETS
    tol = tp._PAD_TOLERANCE
    while len(tp._runs(lens, tol)) > tp._MAX_DECODE_BUCKETS:
        tol *= 2
    assert buckets == tp._runs(lens, tol)  # the tightest tolerance within the bucket cap
    for t in (tp._PAD_TOLERANCE, tol, 1.0):
        for lo, hi in tp._runs(lens, t):
            assert lens[hi - 1] - lens[lo] <= max(t * lens[lo], tp._PAD_SLACK)
    if tol == tp._PAD_TOLERANCE:  # not relaxed: at most 12.5% (or 32 positions) of padding
        padded = sum((hi - lo) * max(lens[lo:hi]) for lo, hi in buckets)
        assert padded <= sum(lens) * (1 + tp._PAD_TOLERANCE) + tp._PAD_SLACK * n
