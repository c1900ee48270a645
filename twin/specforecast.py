"""Speculative decoding in the forecast: acceptance rates from an earlier, separate run's step log.

The forecast may not read the acceptance of the runs it is judged against, so a step log inside the
judged runs' own output folder is refused, as is a speculating engine with no earlier log.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinserve.backends.sim.spec import SpecAcceptance
from twinserve.core.spec_decode import SpeculativeConfig
from twinserve.sim.errors import ConfigError
from twinserve.sim.speculative import rates_from_step_log

from twinserve.twin.preflight import FidelityError


class AcceptanceSourceError(FidelityError):
    """The forecast's acceptance rates would not come from an earlier, separate run."""


@dataclass(slots=True)
class SpecForecast:
    """The engine's speculative config and the acceptance the forecast draws from."""

    config: SpeculativeConfig
    source: Path
    rates: list[float]
    sha256: str

    def attach(self, executor: Any, seed: int) -> None:
        """Make a SimExecutor draw each verify step's accepted drafts from the rates."""
        executor.spec = SpecAcceptance(self.config.num_speculative_tokens, self.rates, seed)
        executor.spec_active = self.config.active

    def record(self) -> dict[str, Any]:
        """What forecast.json says about speculation."""
        c = self.config
        return {"method": c.method, "num_speculative_tokens": c.num_speculative_tokens,
                "disable_by_batch_size": c.disable_by_batch_size,
                "acceptance_from": {"path": str(self.source), "sha256": self.sha256, "rates": self.rates,
                                    "model": "one i.i.d. rate per position (sim/speculative.py)"}}


def spec_forecast(config: SpeculativeConfig | None, acceptance_from: str | None,
                  out_dir: str | Path) -> SpecForecast | None:
    """The forecast's speculation (None when the engine does not speculate); refused before anything loads."""
    if config is None:
        if acceptance_from:
            raise FidelityError(f"--acceptance-from {acceptance_from}: the engine does not speculate; give "
                                "--speculative-config too, or drop --acceptance-from")
        return None
    if config.method != "ngram":
        raise FidelityError(f"speculative_config.method {config.method!r}: fidelity forecasts ngram speculation "
                            "only (a calibrated profile prices the target's steps, not a draft model's)")
    if not acceptance_from:
        raise AcceptanceSourceError(
            "the engine speculates: give --acceptance-from RUN/steps_real.csv, the step log of an earlier, "
            "separate run (fidelity's steps_real.csv, or --step-log-path of any run), so the forecast's "
            "acceptance is known before the judged runs start")
    source = Path(acceptance_from).resolve()
    out = Path(out_dir).resolve()
    if source == out or out in source.parents:
        raise AcceptanceSourceError(
            f"--acceptance-from {acceptance_from} lies in --out {out_dir}, which the judged runs write: the "
            "forecast would read the judged run's own acceptance; pass a step log of an earlier run kept "
            "elsewhere")
    try:
        rates = rates_from_step_log(source, config.num_speculative_tokens)
    except ConfigError as e:
        raise AcceptanceSourceError(f"--acceptance-from {acceptance_from}: {e}") from None
    return SpecForecast(config, source, rates, hashlib.sha256(source.read_bytes()).hexdigest())
