"""`simulate search`'s own input checks: each a ConfigError naming the file, line and field."""

from __future__ import annotations

from typing import Sequence

from twinserve.sim.config import StudyConfig, field_error, find_line, source_text
from twinserve.sim.errors import ConfigError
from twinserve.sim.search import parse_slos


def search_slos(cfg: StudyConfig, specs: Sequence[str]) -> dict[str, float]:
    """The SLOs searched: --slo flags, else [slo] ttft_s and tpot_s as p99."""
    if specs:
        return parse_slos(specs)
    return {"p99_ttft_s": cfg.slo.ttft_s, "p99_tpot_s": cfg.slo.tpot_s}


def check_search(cfg: StudyConfig, grid: dict[str, list[str]], explicit_target: bool) -> None:
    """Refuse a search that cannot mean anything before any run."""
    text = source_text(cfg)
    if text and not grid and find_line(text, "search.grid", None) is not None:
        raise ConfigError("search.grid", "the table has no axes, so there is nothing to search; add "
                          "one, e.g. tensor_parallel_size = [2, 4], or remove the table",
                          cfg.source, find_line(text, "search.grid", None))
    target = cfg.search.target_rate
    ln = find_line(text, "search", "target_rate") if text else None
    set_in_file = ln is not None and "target_rate" in text.splitlines()[ln - 1]
    if (explicit_target or set_in_file) and not target > 0:
        if explicit_target:
            raise ConfigError("--target-rate", f"{target:g} req/s: a target rate must be > 0 "
                              "(leave it out to rank by cost per token)")
        raise field_error(cfg, "search.target_rate", f"{target:g} req/s: a target rate must be "
                          "> 0 (leave it out to rank by cost per token)")
    c = cfg.cluster
    if c.num_prefill_replicas and c.num_prefill_replicas >= c.num_replicas:
        raise field_error(cfg, "cluster.num_prefill_replicas",
                          f"{c.num_prefill_replicas} prefill replica(s) of {c.num_replicas} leaves "
                          "no decode replica; the split must be smaller than num_replicas")
