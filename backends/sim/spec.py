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
        self._np_rng = None  # draw_accepted's numpy Generator, made on first use

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

    def rates_of(self, req_id: str) -> list[float]:
        """The request's per-position rates (with its spread factor, drawn on first use)."""
        return self._rates(req_id)

    def draw_accepted(self, rates):
        """Accepted drafts for each row of rates (a numpy array, requests x drafts): each row's positions
        pass in order until one fails, as accepted() draws them, from a numpy stream seeded once from this
        object's own (so a seeded run repeats; not the same draws as accepted())."""
        import numpy as np  # the windowed path only (sim/spec_window.py)

        rng = self._np_rng
        if rng is None:
            rng = self._np_rng = np.random.default_rng(self._rng.getrandbits(64))
        ok = rng.random(rates.shape) < rates
        if ok.shape[1] == 1:
            return ok[:, 0].astype(np.int64)
        return np.cumprod(ok, axis=1).sum(axis=1)

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
