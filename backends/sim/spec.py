"""How many drafts a simulated verify step accepts: per-position acceptance rates, seeded.

rates[i] = P(position i accepted | all earlier were): Leviathan et al. 2023, made
position-dependent as vLLM reports it; an optional lognormal per-request spread.
"""

from __future__ import annotations

import math
import random
from typing import Sequence


class SpecAcceptance:
    """Draws each verify step's accepted count from the rates; proposes k drafts a step."""

    def __init__(self, num_speculative_tokens: int, rates: Sequence[float], seed: int = 0,
                 spread: float = 0.0) -> None:
        self.k = num_speculative_tokens
        # Positions past the list take its last rate.
        last = rates[-1] if rates else 0.0
        self.rates = [float(rates[i]) if i < len(rates) else float(last) for i in range(self.k)]
        self.spread = spread
        self._rng = random.Random(seed)
        self._factors: dict[str, float] = {}

    def _rates(self, req_id: str) -> list[float]:
        if self.spread <= 0.0:
            return self.rates
        f = self._factors.get(req_id)
        if f is None:
            f = self._factors[req_id] = math.exp(self._rng.gauss(0.0, self.spread))
        return [min(1.0, r * f) for r in self.rates]

    def accepted(self, req_id: str, num_drafts: int) -> int:
        """Accepted drafts out of num_drafts: positions pass in order until one fails."""
        rates = self._rates(req_id)
        rnd = self._rng.random
        for i in range(num_drafts):
            if rnd() >= rates[i]:
                return i
        return num_drafts

    def forget(self, req_id: str) -> None:
        """Drop a finished request's spread factor."""
        self._factors.pop(req_id, None)

    def expected_tokens_per_step(self) -> float:
        """Mean tokens a full draft yields per verify step: 1 + sum of prod(rates[:i+1])."""
        total, p = 1.0, 1.0
        for r in self.rates:
            p *= r
            total += p
        return total
