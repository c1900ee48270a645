"""A cost model whose coefficients come from a measured step profile (JSON).

Profile format (``twinserve-step-profile/1``), one JSON object::

    {
      "format": "twinserve-step-profile/1",
      "model": "SmolLM2-135M",          # informative
      "hardware": "H200",               # informative
      "tensor_parallel_size": 1,        # informative
      "coefficients": {                 # seconds per unit; a missing key means 0
        "intercept_s": 0.0021,                 # fixed cost of any step
        "per_token_s": 1.1e-6,                 # per new token (prefill + decode)
        "per_prefill_seq_s": 0.0,              # per prefill request in the step
        "per_prefill_attn_s": 2.0e-11,         # per unit of Σ q·(c + q/2)
        "per_prefill_context_token_s": 0.0,    # per cached-context token of prefills
        "per_decode_seq_s": 1.5e-5,            # per decode request
        "per_decode_context_token_s": 3.0e-9   # per context token of decodes
      },
      "fit": {"num_steps": 1234, "r2": 0.99, "mape": 0.03}   # optional, informative
    }

The step time is the intercept plus each coefficient times its feature (see
cost_model.StepFeatures); a negative prediction is clamped to 0. ``fit_profile``
produces such a file from a step log by least squares (FACTS.md: a roofline-shaped
linear model fitted this way tracks profile-based predictions within a few percent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from twinserve.core.errors import TwinserveError

PROFILE_FORMAT = "twinserve-step-profile/1"
COEFFICIENTS = ("intercept_s", "per_token_s", "per_prefill_seq_s", "per_prefill_attn_s",
                "per_prefill_context_token_s", "per_decode_seq_s", "per_decode_context_token_s")
# Step-log columns fit_profile reads (the feature names of StepFeatures, and the measured time).
FEATURE_COLUMNS = ("num_prefill_tokens", "num_prefill_seqs", "prefill_context", "prefill_attn",
                   "num_decode_seqs", "decode_context")


class ProfileError(TwinserveError, ValueError):
    """A step profile file is malformed; the message names the file and the field."""


@dataclass(slots=True)
class FittedCostModel:
    """Linear step-time model over the cost-model features, coefficients from a profile."""

    intercept_s: float = 0.0
    per_token_s: float = 0.0
    per_prefill_seq_s: float = 0.0
    per_prefill_attn_s: float = 0.0
    per_prefill_context_token_s: float = 0.0
    per_decode_seq_s: float = 0.0
    per_decode_context_token_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    name: str = "fitted"

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """Seconds for a step: the linear form, clamped at zero."""
        t = (self.intercept_s + self.per_token_s * (num_prefill_tokens + num_decode_seqs)
             + self.per_prefill_seq_s * num_prefill_seqs
             + self.per_prefill_attn_s * prefill_attn
             + self.per_prefill_context_token_s * prefill_context
             + self.per_decode_seq_s * num_decode_seqs
             + self.per_decode_context_token_s * decode_context)
        return t if t > 0.0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The profile as a JSON-ready mapping."""
        out: dict[str, Any] = {"format": PROFILE_FORMAT}
        out.update({k: v for k, v in self.meta.items() if k not in ("format", "coefficients")})
        out["coefficients"] = {k: getattr(self, k) for k in COEFFICIENTS}
        return out

    def save(self, path: str | Path) -> None:
        """Write the profile file."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<profile>") -> "FittedCostModel":
        """Build from a parsed profile, naming the bad field on error."""
        if not isinstance(data, Mapping):
            raise ProfileError(f"{source}: a profile is a JSON object")
        fmt = data.get("format", PROFILE_FORMAT)
        if fmt != PROFILE_FORMAT:
            raise ProfileError(f"{source}: field 'format' is {fmt!r}, expected {PROFILE_FORMAT!r}")
        coeffs = data.get("coefficients")
        if not isinstance(coeffs, Mapping):
            raise ProfileError(f"{source}: field 'coefficients' is missing or not an object")
        values: dict[str, float] = {}
        for key, value in coeffs.items():
            if key not in COEFFICIENTS:
                raise ProfileError(f"{source}: unknown coefficient 'coefficients.{key}'; "
                                   f"known: {', '.join(COEFFICIENTS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProfileError(f"{source}: field 'coefficients.{key}' must be a number")
            values[key] = float(value)
        meta = {k: v for k, v in data.items() if k != "coefficients"}
        return cls(**values, meta=meta)

    @classmethod
    def load(cls, path: str | Path) -> "FittedCostModel":
        """Read a profile file."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise ProfileError(f"{p}: profile file not found") from None
        except json.JSONDecodeError as e:
            raise ProfileError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
        return cls.from_dict(data, str(p))


def fit_profile(rows: Iterable[Mapping[str, float]], time_key: str = "step_time_s",
                **meta: Any) -> FittedCostModel:
    """Least-squares fit of the coefficients to logged steps (each row: features + time)."""
    import numpy as np

    xs, ys = [], []
    for row in rows:
        f = [float(row[c]) for c in FEATURE_COLUMNS]
        tokens = f[0] + f[4]
        # Columns in COEFFICIENTS order.
        xs.append([1.0, tokens, f[1], f[3], f[2], f[4], f[5]])
        ys.append(float(row[time_key]))
    if len(xs) < len(COEFFICIENTS):
        raise ProfileError(f"need at least {len(COEFFICIENTS)} steps to fit, got {len(xs)}")
    x = np.asarray(xs)
    y = np.asarray(ys)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    pred = x @ coef
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) or 1.0
    mape = float(np.mean(np.abs(pred - y) / np.maximum(y, 1e-12)))
    meta = dict(meta)
    meta["fit"] = {"num_steps": len(ys), "r2": 1.0 - ss_res / ss_tot, "mape": mape}
    return FittedCostModel(*(float(c) for c in coef), meta=meta)
