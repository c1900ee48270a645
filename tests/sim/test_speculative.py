"""Speculative decoding in the simulator: the [speculative] table, the drafts the same scheduler
schedules, acceptance drawn per position, verify steps priced, and the errors of the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.backends.sim.spec import SpecAcceptance
from twinserve.sim.build import build, simulate
from twinserve.sim.config import from_dict, load_config, resolve_field, set_field
from twinserve.sim.errors import ConfigError
from twinserve.sim.speculative import rates_from_step_log

from .helpers import fingerprint, small_config

RATES = [0.8, 0.6, 0.5, 0.4]


def _spec(cfg, rates=RATES, k=4, **kw):
    set_field(cfg, "speculative.method", "ngram")
    set_field(cfg, "speculative.num_speculative_tokens", k)
    cfg.speculative.acceptance_rates = list(rates)
    for name, value in kw.items():
        set_field(cfg, f"speculative.{name}", value)
    return cfg


def test_speculative_study_completes_every_request_in_fewer_steps_at_the_drawn_rates() -> None:
    plain_built, plain = simulate(small_config(num_requests=60, rate=2.0))
    built, spec = simulate(_spec(small_config(num_requests=60, rate=2.0)))
    want = {r.request_id: r.num_output_tokens for r in plain.records}
    assert {r.request_id: r.num_output_tokens for r in spec.records} == want
    assert all(r.finish_time is not None for r in spec.records)
    stats = built.simulation.core.scheduler.spec_stats
    assert stats.num_drafts > 0
    # Position i is reached and accepted with probability prod(rates[:i+1]) per full draft.
    full = stats.num_drafts
    expected = [0.8, 0.48, 0.24, 0.096]
    for got, p in zip(stats.accepted_per_pos, expected):
        assert abs(got / full - p) < 0.05
    assert spec.num_steps < plain.num_steps
    tpot = [(r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
            for r in spec.records if r.num_output_tokens > 1]
    tpot_plain = [(r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
                  for r in plain.records if r.num_output_tokens > 1]
    assert sum(tpot) < sum(tpot_plain)


def test_a_verify_step_is_priced_as_k_plus_one_tokens_per_sequence() -> None:
    built = build(_spec(small_config(num_requests=1, rate=1.0), rates=[1.0] * 3, k=3))
    seen = []
    ex = built.simulation.executor
    inner = ex.cost_model

    class Spy:
        name = "spy"

        def step_time(self, pt, ps, pc, pa, ds, dc):
            seen.append((pt, ps, ds))
            return inner.step_time(pt, ps, pc, pa, ds, dc)

    ex.cost_model = Spy()
    built.simulation.run()
    # After the prefill, every step but the last verifies 3 drafts: a 4-token chunk, no decode.
    assert seen[1][:3] == (4, 1, 0)
    assert sum(1 for s in seen[1:-1] if s == (4, 1, 0)) == len(seen) - 2


def test_disable_by_batch_size_leaves_the_run_unchanged_when_no_draft_runs(monkeypatch) -> None:
    from twinserve.sim import spec_window
    monkeypatch.setattr(spec_window, "SPEC_WINDOW_MIN_BATCH", 1)  # this small batch takes windows too
    plain = simulate(small_config(num_requests=40, rate=50.0))[1]
    off = simulate(_spec(small_config(num_requests=40, rate=50.0), disable_by_batch_size=1))[1]
    assert fingerprint(off) == fingerprint(plain)
    # Fast-forwarding a drafting batch draws its acceptances per window (another random stream):
    # tests/sim/test_spec_window.py compares it with stepping; the output lengths are the same.
    cfg = _spec(small_config(num_requests=40, rate=5.0))
    ff = simulate(cfg)[1]
    set_field(cfg, "run.fast_forward", False)
    stepped = simulate(cfg)[1]
    assert ff.num_ff_windows > 0
    assert ({r.request_id: r.num_output_tokens for r in ff.records}
            == {r.request_id: r.num_output_tokens for r in stepped.records})


def test_a_study_proposes_no_drafts_from_a_batch_at_disable_by_batch_size() -> None:
    """As the real model runner: a step holding disable_by_batch_size requests or more proposes none
    (the scheduler would not verify them; kept, they were verified one step early once the batch shrank).
    tests/real/test_spec_disable_boundary.py runs this against the engine."""
    built = build(_spec(small_config(num_requests=40, rate=20.0), disable_by_batch_size=3))
    ex = built.simulation.executor
    run = ex.execute
    seen: list[tuple[int, bool]] = []

    def execute(so, *a, **kw):
        out = run(so, *a, **kw)
        seen.append((len(ex.state), out.spec_token_ids is not None))
        return out
    ex.execute = execute
    built.simulation.run()
    assert {held < 3 for held, proposed in seen if proposed} == {True}
    assert any(held >= 3 for held, _ in seen) and any(p for _, p in seen)
    assert all(p for held, p in seen if held < 3)


def test_acceptance_draws_follow_the_rates_and_the_spread() -> None:
    acc = SpecAcceptance(4, [0.5], seed=1)
    assert acc.rates == [0.5] * 4
    n = 20_000
    counts = [acc.accepted("r", 4) for _ in range(n)]
    assert abs(sum(c >= 1 for c in counts) / n - 0.5) < 0.02
    assert abs(sum(c >= 2 for c in counts) / n - 0.25) < 0.02
    assert acc.expected_tokens_per_step() == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    spread = SpecAcceptance(4, [0.5], seed=1, spread=1.0)
    means = [sum(spread.accepted(f"r{i}", 4) for _ in range(200)) / 200 for i in range(20)]
    assert max(means) - min(means) > 1.0  # requests differ, not just draws


def test_acceptance_from_a_step_log_fits_one_rate_per_position(tmp_path: Path) -> None:
    log = tmp_path / "steps.csv"
    # 100 steps, each verifying one 4-token draft, 1.5 accepted on average.
    rows = ["step,num_spec_reqs,num_draft_tokens,num_accepted_tokens"]
    rows += [f"{i},1,4,{1 if i % 2 else 2}" for i in range(100)]
    log.write_text("\n".join(rows) + "\n")
    rates = rates_from_step_log(log, 4)
    a = rates[0]
    assert rates == [a] * 4
    assert a + a ** 2 + a ** 3 + a ** 4 == pytest.approx(1.5, abs=1e-4)
    study = tmp_path / "s.toml"
    study.write_text('[engine]\nmodel = "Llama-2-7B"\nhardware = "A100-80GB"\n[workload]\nnum_requests = 10\n'
                     '[speculative]\nmethod = "ngram"\nacceptance_from = "steps.csv"\n')
    built, result = simulate(load_config(study))
    assert built.simulation.executor.spec.rates == rates
    assert all(r.finish_time is not None for r in result.records)


@pytest.mark.parametrize("table, field", [
    ({"method": "medusa", "acceptance_rates": [0.5] * 4}, "speculative.method"),
    ({"method": "ngram", "num_speculative_tokens": 0, "acceptance_rates": [0.5] * 4},
     "speculative.num_speculative_tokens"),
    ({"method": "ngram", "acceptance_rates": [0.5, 1.5]}, "speculative.acceptance_rates"),
    ({"method": "ngram"}, "speculative.acceptance_rates"),
    ({"method": "ngram", "acceptance_rates": [0.5] * 4, "acceptance_from": "x.csv"}, "speculative.acceptance_rates"),
    ({"method": "ngram", "acceptance_rates": [0.5] * 4, "k": 3}, "speculative.k"),
])
def test_bad_speculative_tables_name_the_field(table: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict({"speculative": table})
    assert field in str(e.value)


def test_sweeps_and_search_resolve_the_speculative_fields() -> None:
    assert resolve_field("num_speculative_tokens") == "speculative.num_speculative_tokens"
    assert resolve_field("acceptance_spread") == "speculative.acceptance_spread"
    cfg = small_config()
    set_field(cfg, "num_speculative_tokens", "3")  # as a --grid value arrives
    assert cfg.speculative.num_speculative_tokens == 3
    with pytest.raises(ConfigError):
        set_field(cfg, "num_speculative_tokens", "99")
    # One list of rates serves every k of a sweep: positions past k never run.
    built = build(_spec(small_config(num_requests=2), rates=RATES, k=2))
    assert built.simulation.executor.spec.rates == RATES[:2]


def test_fewer_rates_than_k_is_an_error_naming_the_field_not_a_silent_extension() -> None:
    with pytest.raises(ConfigError) as e:
        from_dict({"speculative": {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rates": [0.8, 0.6]}})
    assert "speculative.acceptance_rates" in str(e.value) and "num_speculative_tokens = 4" in str(e.value)
    # Rates set in code, or k raised by a sweep past the list: refused where the run is built.
    with pytest.raises(ConfigError, match="speculative.acceptance_rates"):
        build(_spec(small_config(num_requests=1, rate=1.0), rates=[0.8, 0.6], k=3))
    from_dict({"speculative": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": RATES}})


def test_the_run_summary_says_whether_speculation_was_on() -> None:
    from twinserve.sim.cli import _notes

    off = _notes(small_config(), 0.1, 1)
    assert "speculative decoding: off" in off
    on = " | ".join(_notes(_spec(small_config(), k=3), 0.1, 1))
    assert "speculative decoding: ngram, k = 3, acceptance rates [0.8, 0.6, 0.5]" in on


_STUDY = ('[workload]\nnum_requests = 8\nrate = 4.0\nprompt_dist = "uniform"\nprompt_min = 50\nprompt_max = 200\n'
          'output_dist = "uniform"\noutput_min = 5\noutput_max = 20\n')


@pytest.mark.parametrize("spec_table, said", [
    ("", "speculative decoding: off"),
    ('[speculative]\nmethod = "ngram"\nnum_speculative_tokens = 2\nacceptance_rates = [0.7, 0.5]\n',
     "speculative decoding: ngram, k = 2, acceptance rates [0.7, 0.5]"),
], ids=["off", "on"])
def test_a_study_summary_says_whether_speculation_was_on(tmp_path: Path, capsys, spec_table: str,
                                                         said: str) -> None:
    from twinserve.sim import cli

    f = tmp_path / "study.toml"
    f.write_text(_STUDY + spec_table)
    assert cli.main(["run", "--config", str(f), "--out", str(tmp_path / "o")]) == 0
    assert said in (tmp_path / "o" / "summary.md").read_text()


def test_a_study_with_fewer_rates_than_k_exits_2_naming_the_field(tmp_path: Path, capsys) -> None:
    """Issue 53 item 12: refused at the study file (it was extended silently with the last rate)."""
    from twinserve.sim import cli

    f = tmp_path / "study.toml"
    f.write_text(_STUDY + '[speculative]\nmethod = "ngram"\nnum_speculative_tokens = 4\n'
                 'acceptance_rates = [0.8, 0.6]\n')
    rc = cli.main(["run", "--config", str(f), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "speculative.acceptance_rates" in err and "num_speculative_tokens = 4" in err, err
    assert not (tmp_path / "o").exists()
    # A sweep that raises k past the list: that point fails naming the field (exit 1), the others are written.
    f.write_text(_STUDY + '[speculative]\nmethod = "ngram"\nnum_speculative_tokens = 2\n'
                 'acceptance_rates = [0.8, 0.6]\n')
    rc = cli.main(["sweep", "--config", str(f), "--out", str(tmp_path / "s"),
                   "--grid", "speculative.num_speculative_tokens=2,3"])
    err = capsys.readouterr().err
    assert rc == 1 and "point num_speculative_tokens=3 failed" in err and "speculative.acceptance_rates" in err, err


def test_a_disaggregated_clusters_decode_workers_speculate_too() -> None:
    # The decode workers' executor is swapped for one that discounts the transferred prefill: it kept the
    # target's acceptance draws and draft model behind, so a disaggregated MTP row decoded one token a step.
    from twinserve.sim.cluster_study import simulate_cluster

    def cluster(spec: bool):
        cfg = small_config(concurrency=4, num_requests=24, warmup_requests=0, num_replicas=2,
                           num_prefill_replicas=1, output_dist="fixed", output_mean=40)
        return simulate_cluster(_spec(cfg) if spec else cfg)[1]

    def decode_steps(result) -> int:
        return sum(r.num_steps for r, label in zip(result.replicas, result.labels) if "decode" in label)

    plain, spec = cluster(False), cluster(True)
    assert decode_steps(spec) < 0.7 * decode_steps(plain)  # 1 + 0.8 + 0.48 + ... tokens a step, not 1
