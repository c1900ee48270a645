"""A cost model whose coefficients come from a measured step profile (JSON; format: docs/twin.md).

A step costs coefficients·features + overhead_scale × overhead_coefficients·features, clamped at
zero (features: cost_model.StepFeatures). per_token_sq_s bends the per-token cost upward as a CPU
GEMM outgrows cache. FACTS.md: a roofline-shaped linear model fitted on relative error tracks
profile-based predictions within a few percent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from twinserve.core.errors import TwinserveError, unreadable_text

from twinserve.backends.sim.cost_model import windowed_features

PROFILE_FORMAT = "twinserve-step-profile/4"
FORMATS = ("twinserve-step-profile/1", "twinserve-step-profile/2", "twinserve-step-profile/3", PROFILE_FORMAT)
COEFFICIENTS = ("intercept_s", "per_token_s", "per_prefill_seq_s", "per_prefill_attn_s",
                "per_prefill_context_token_s", "per_decode_seq_s", "per_decode_context_token_s",
                "per_token_sq_s")
# Step-log columns the fit reads (StepFeatures' names).
FEATURE_COLUMNS = ("num_prefill_tokens", "num_prefill_seqs", "prefill_context", "prefill_attn",
                   "num_decode_seqs", "decode_context")
PROFILES_DIR = Path(__file__).parent / "profiles"
# Shape measures whose fitted maxima a profile records (fit "range"): beyond them it extrapolates.
RANGE_DIMS = FEATURE_COLUMNS + ("num_tokens", "decode_context_per_seq")


def dims_beyond(top: Mapping[str, float], measures: Sequence[float]) -> list[str]:
    """The RANGE_DIMS in which a step's measures (shape_measures) pass the largest fitted (top)."""
    return [d for d, v in zip(RANGE_DIMS, measures) if d in top and v > top[d]]


def shape_measures(num_prefill_tokens: float, num_prefill_seqs: float, prefill_context: float,
                   prefill_attn: float, num_decode_seqs: float, decode_context: float) -> tuple[float, ...]:
    """A step's shape by RANGE_DIMS: its features, its new tokens, its decodes' mean context."""
    return (num_prefill_tokens, num_prefill_seqs, prefill_context, prefill_attn, num_decode_seqs,
            decode_context, num_prefill_tokens + num_decode_seqs,
            decode_context / num_decode_seqs if num_decode_seqs else 0.0)

Coefs = tuple[float, float, float, float, float, float, float, float]
ZERO: Coefs = (0.0,) * len(COEFFICIENTS)  # type: ignore[assignment]


# A profile's "attention" record: the served model's sliding window and how many layers use it.
ATTENTION_KEYS = ("sliding_window", "num_sliding_layers", "num_layers")


class ProfileError(TwinserveError, ValueError):
    """A step profile file is malformed or does not fit; the message names the file and the field."""


def design_row(num_prefill_tokens: float, num_prefill_seqs: float, prefill_context: float,
               prefill_attn: float, num_decode_seqs: float, decode_context: float) -> list[float]:
    """The regressors of one step, in COEFFICIENTS order."""
    tokens = num_prefill_tokens + num_decode_seqs
    return [1.0, tokens, num_prefill_seqs, prefill_attn, prefill_context, num_decode_seqs, decode_context,
            tokens * tokens]


def _dot(c: Coefs, pt: float, ps: float, pc: float, pa: float, ds: float, dc: float) -> float:
    n = pt + ds
    return c[0] + c[1] * n + c[2] * ps + c[3] * pa + c[4] * pc + c[5] * ds + c[6] * dc + c[7] * n * n


@dataclass(slots=True)
class Regime:
    """Coefficients for steps of at most max_num_tokens new tokens (decode_only: and no prefill tokens)."""

    max_num_tokens: int
    coefficients: Coefs
    overhead: Coefs = ZERO
    # CUDA-graph decode: pure-decode batches replay a graph; any prefill runs eagerly.
    decode_only: bool = False

    def matches(self, num_prefill_tokens: float, tokens: float) -> bool:
        """Whether a step of these many prefill tokens and new tokens in all is priced here."""
        return tokens <= self.max_num_tokens and not (self.decode_only and num_prefill_tokens)


def regime_order(r: Regime) -> tuple[bool, int]:
    """Decode-only regimes first (a graph path wins over token-count breakpoints), then by size."""
    return (not r.decode_only, r.max_num_tokens)


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
    per_token_sq_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    name: str = "fitted"
    overhead: Coefs = ZERO
    regimes: list[Regime] = field(default_factory=list)
    # Scales the CPU overhead part: 0.5 asks "what if it were twice as fast".
    overhead_scale: float = 1.0
    # Scales whole steps: the speed probe's ratio to the profile's machine.
    time_scale: float = 1.0
    # Scales the prefill share of a step on top: prefill (compute-bound) may slow unlike decode.
    prefill_scale: float = 1.0
    # Cost of the steps after an idle gap (wake_after): an extra time, not a factor, since it does
    # not grow with the step (docs/twin-log.md, "idle"); /3 profiles may carry factors instead.
    wake_idle_s: tuple[float, ...] = ()
    wake_extra_s: tuple[tuple[float, ...], ...] = ()
    wake_factors: tuple[tuple[float, ...], ...] = ()
    # Sliding-window layers (the profile's "attention"): their attention terms stop at the window.
    sliding_window: int = 0
    sliding_share: float = 0.0
    # Profiles calibrated on verify steps price a verify row (k' + 1 tokens at context c) as
    # k' + 1 decode rows at c, plus these: per step that verifies, per verify row, per draft token
    # (twin/verifyfit.py).
    per_verify_seq_s: float = 0.0
    per_draft_token_s: float = 0.0
    per_verify_step_s: float = 0.0
    # Set by a fit on verify steps (or a profile's "verify" field): a fitted term of zero still
    # means "price as decode rows".
    verify_fitted: bool = False

    @property
    def prices_verify(self) -> bool:
        """Whether verify rows are priced as decode rows plus the verify term (else as prefill chunks)."""
        return self.verify_fitted or bool(self.per_verify_step_s or self.per_verify_seq_s or self.per_draft_token_s)

    def verify_time(self, num_spec_reqs: int, num_draft_tokens: int) -> float:
        """Seconds a step's verify rows add to their price as decode rows (verify_time's term)."""
        if not num_spec_reqs:
            return 0.0
        return (self.per_verify_step_s + self.per_verify_seq_s * num_spec_reqs
                + self.per_draft_token_s * num_draft_tokens) * self.time_scale

    def wake_after(self, idle_s: float) -> list[tuple[float, float]]:
        """(factor, extra seconds) of each step after an idle gap: cost = factor x model + extra.

        Interpolated between measured gaps (from 0 at no gap), held past the longest; [] if none."""
        gaps = self.wake_idle_s
        if not gaps or idle_s <= 0.0:
            return []
        n = len((self.wake_extra_s or self.wake_factors)[0])
        extra = self.wake_extra_s or ((0.0,) * n,) * len(gaps)
        factors = self.wake_factors or ((1.0,) * n,) * len(gaps)
        if idle_s >= gaps[-1]:
            i, w = len(gaps) - 1, 1.0
        else:
            i = 0
            while gaps[i] < idle_s:
                i += 1
            g0 = gaps[i - 1] if i else 0.0
            w = (idle_s - g0) / (gaps[i] - g0)
        f0, e0 = (factors[i - 1], extra[i - 1]) if i else ((1.0,) * n, (0.0,) * n)
        return [(a + w * (b - a), (c + w * (d - c)) * self.time_scale)
                for a, b, c, d in zip(f0, factors[i], e0, extra[i])]

    @property
    def coefficients(self) -> Coefs:
        """The device-path coefficients in COEFFICIENTS order."""
        return tuple(getattr(self, k) for k in COEFFICIENTS)  # type: ignore[return-value]

    @property
    def model(self) -> str | None:
        """The model the profile was made for, if it says."""
        m = self.meta.get("model")
        return str(m) if m else None

    @property
    def shape_range(self) -> dict[str, float]:
        """The largest step shapes the profile was fitted on, by RANGE_DIMS ({} if not recorded)."""
        got = (self.meta.get("fit") or {}).get("range") or {}
        return {d: float(got[d]) for d in RANGE_DIMS if d in got}

    def beyond_range(self, *features: float) -> list[str]:
        """The RANGE_DIMS in which a step (its six features) is larger than any step fitted."""
        return dims_beyond(self.shape_range, shape_measures(*features))

    def step_time(self, num_prefill_tokens: int, num_prefill_seqs: int, prefill_context: int,
                  prefill_attn: float, num_decode_seqs: int, decode_context: int) -> float:
        """Seconds for a step: device part plus scaled CPU overhead, clamped at zero."""
        if self.sliding_window:
            (num_prefill_tokens, num_prefill_seqs, prefill_context, prefill_attn, num_decode_seqs,
             decode_context) = windowed_features(self.sliding_window, self.sliding_share, num_prefill_tokens,
                                                 num_prefill_seqs, prefill_context, prefill_attn,
                                                 num_decode_seqs, decode_context)
        args = (num_prefill_tokens, num_prefill_seqs, prefill_context, prefill_attn,
                num_decode_seqs, decode_context)
        if self.regimes:
            tokens = num_prefill_tokens + num_decode_seqs
            for r in self.regimes:
                if r.matches(num_prefill_tokens, tokens):
                    t = _dot(r.coefficients, *args) + self.overhead_scale * _dot(r.overhead, *args)
                    if num_prefill_tokens and self.prefill_scale != 1.0:
                        t *= 1.0 + (self.prefill_scale - 1.0) * num_prefill_tokens / tokens
                    t *= self.time_scale
                    return t if t > 0.0 else 0.0
        n = num_prefill_tokens + num_decode_seqs
        t = (self.intercept_s + (self.per_token_s + self.per_token_sq_s * n) * n
             + self.per_prefill_seq_s * num_prefill_seqs
             + self.per_prefill_attn_s * prefill_attn
             + self.per_prefill_context_token_s * prefill_context
             + self.per_decode_seq_s * num_decode_seqs
             + self.per_decode_context_token_s * decode_context)
        if self.overhead_scale and self.overhead is not ZERO:
            t += self.overhead_scale * _dot(self.overhead, *args)
        if num_prefill_tokens and self.prefill_scale != 1.0:
            t *= 1.0 + (self.prefill_scale - 1.0) * num_prefill_tokens / (num_prefill_tokens + num_decode_seqs)
        if self.time_scale != 1.0:
            t *= self.time_scale
        return t if t > 0.0 else 0.0

    def split(self, *features: float) -> tuple[float, float]:
        """(device part, CPU overhead part) of a step's predicted time, overhead unscaled."""
        if self.sliding_window:
            features = windowed_features(self.sliding_window, self.sliding_share, *features)
        tokens = features[0] + features[4]
        for r in self.regimes:
            if r.matches(features[0], tokens):
                return _dot(r.coefficients, *features), _dot(r.overhead, *features)
        return _dot(self.coefficients, *features), _dot(self.overhead, *features)

    def to_dict(self) -> dict[str, Any]:
        """The profile as a JSON-ready mapping."""
        out: dict[str, Any] = {"format": PROFILE_FORMAT}
        out.update({k: v for k, v in self.meta.items()
                    if k not in ("format", "coefficients", "overhead_coefficients", "regimes")})
        out["coefficients"] = dict(zip(COEFFICIENTS, self.coefficients))
        out["overhead_coefficients"] = dict(zip(COEFFICIENTS, self.overhead))
        if self.wake_idle_s:
            out["wake"] = ({"idle_s": list(self.wake_idle_s), "extra_s": [list(r) for r in self.wake_extra_s]}
                           if self.wake_extra_s else
                           {"idle_s": list(self.wake_idle_s), "factors": [list(r) for r in self.wake_factors]})
        if self.prices_verify:
            out["verify"] = {"per_verify_step_s": self.per_verify_step_s, "per_verify_seq_s": self.per_verify_seq_s,
                             "per_draft_token_s": self.per_draft_token_s}
        if self.regimes:
            out["regimes"] = [{"max_num_tokens": r.max_num_tokens,
                               **({"decode_only": True} if r.decode_only else {}),
                               "coefficients": dict(zip(COEFFICIENTS, r.coefficients)),
                               "overhead_coefficients": dict(zip(COEFFICIENTS, r.overhead))}
                              for r in self.regimes]
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
        if fmt not in FORMATS:
            raise ProfileError(f"{source}: field 'format' is {fmt!r}, expected one of {FORMATS}")
        coefs = _coefs(data.get("coefficients"), "coefficients", source, required=True)
        overhead = _coefs(data.get("overhead_coefficients"), "overhead_coefficients", source)
        regimes = []
        raw_regimes = data.get("regimes", [])
        if not isinstance(raw_regimes, list):
            raise ProfileError(f"{source}: field 'regimes' must be a list")
        for i, r in enumerate(raw_regimes):
            where = f"regimes[{i}]"
            if not isinstance(r, Mapping):
                raise ProfileError(f"{source}: field '{where}' must be an object")
            m = r.get("max_num_tokens")
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise ProfileError(f"{source}: field '{where}.max_num_tokens' must be an integer >= 1")
            decode_only = r.get("decode_only", False)
            if not isinstance(decode_only, bool):
                raise ProfileError(f"{source}: field '{where}.decode_only' must be true or false")
            regimes.append(Regime(m, _coefs(r.get("coefficients"), f"{where}.coefficients", source,
                                            required=True),
                                  _coefs(r.get("overhead_coefficients"),
                                         f"{where}.overhead_coefficients", source), decode_only))
        regimes.sort(key=regime_order)
        gaps, factors, extra = _wake(data.get("wake"), source)
        verify = _verify(data.get("verify"), source)
        _check_provenance(data.get("provenance"), source)
        meta = {k: v for k, v in data.items()
                if k not in ("coefficients", "overhead_coefficients", "regimes", "wake", "verify")}
        window, share = attention_window(meta, source)
        return cls(*coefs, meta=meta, overhead=overhead, regimes=regimes, wake_idle_s=gaps,
                   wake_factors=factors, wake_extra_s=extra, sliding_window=window, sliding_share=share,
                   per_verify_step_s=verify[0], per_verify_seq_s=verify[1], per_draft_token_s=verify[2],
                   verify_fitted="verify" in data)

    @classmethod
    def load(cls, path: str | Path) -> "FittedCostModel":
        """Read a profile file, or a shipped one by 'builtin:NAME'."""
        p = resolve_profile(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise ProfileError(f"{p}: profile file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            line, why = unreadable_text(p, e)
            raise ProfileError(f"{p}{f':{line}' if line else ''}: {why}") from None
        except json.JSONDecodeError as e:
            raise ProfileError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
        return cls.from_dict(data, str(p))


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with the package (use as 'builtin:NAME')."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def resolve_profile(path: str | Path) -> Path:
    """A profile path, with 'builtin:NAME' naming a shipped profile."""
    text = str(path)
    if text.startswith("builtin:"):
        name = text.split(":", 1)[1]
        p = PROFILES_DIR / f"{name}.json"
        if not p.exists():
            raise ProfileError(f"unknown builtin profile {name!r}; shipped: "
                               f"{', '.join(builtin_profiles()) or 'none'}")
        return p
    return Path(path)


def attention_window(meta: Mapping[str, Any], source: str = "<profile>") -> tuple[int, float]:
    """(window, share of layers sliding) from a profile's "attention" record; (0, 0.0) without one."""
    att = meta.get("attention")
    if att is None:
        return 0, 0.0
    if not isinstance(att, Mapping):
        raise ProfileError(f"{source}: field 'attention' must be an object")
    vals = {}
    for key in ATTENTION_KEYS:
        v = att.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "num_layers" else 0):
            raise ProfileError(f"{source}: field 'attention.{key}' must be an integer >= "
                               f"{1 if key == 'num_layers' else 0}, got {v!r}")
        vals[key] = v
    window, sliding, layers = (vals[k] for k in ATTENTION_KEYS)
    if sliding > layers or bool(window) != bool(sliding):
        raise ProfileError(f"{source}: field 'attention' is inconsistent: {dict(att)!r} (a window needs "
                           "sliding layers, at most num_layers of them)")
    return window, sliding / layers


def _wake(raw: Any, source: str) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...],
                                          tuple[tuple[float, ...], ...]]:
    """(idle gaps, factors, extra seconds) of a profile's "wake" field; one of the last two is empty."""
    if raw is None:
        return (), (), ()
    bad = ProfileError(f"{source}: field 'wake' must be {{\"idle_s\": [increasing seconds > 0], "
                       "\"extra_s\": [one list of seconds >= 0 per gap, all of one length]} (or, "
                       "in a /3 profile, \"factors\": [lists of factors > 0] instead of extra_s)")
    if not isinstance(raw, Mapping) or set(raw) not in ({"idle_s", "factors"}, {"idle_s", "extra_s"}):
        raise bad
    key = "extra_s" if "extra_s" in raw else "factors"
    gaps, rows = raw["idle_s"], raw[key]
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    ok = (lambda v: num(v) and v >= 0) if key == "extra_s" else (lambda v: num(v) and v > 0)  # noqa: E731
    if (not isinstance(gaps, list) or not isinstance(rows, list) or not gaps or len(gaps) != len(rows)
            or not all(num(g) and g > 0 for g in gaps) or any(b <= a for a, b in zip(gaps, gaps[1:]))
            or not all(isinstance(r, list) and r and len(r) == len(rows[0]) and all(ok(f) for f in r)
                       for r in rows)):
        raise bad
    table = tuple(tuple(float(f) for f in r) for r in rows)
    return (tuple(float(g) for g in gaps),) + (((), table) if key == "extra_s" else (table, ()))


def _check_provenance(raw: Any, source: str) -> None:
    """The shape the machine checks read: provenance an object, its cpu {capability: str, flags: [str]}."""
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{source}: field 'provenance' must be an object")
    cpu = raw.get("cpu")
    if cpu is None:
        return
    if not isinstance(cpu, Mapping):
        raise ProfileError(f"{source}: field 'provenance.cpu' must be an object "
                           "({\"capability\": torch's CPU kernel level, \"flags\": [kernel flags]})")
    if cpu.get("capability") is not None and not isinstance(cpu["capability"], str):
        raise ProfileError(f"{source}: field 'provenance.cpu.capability' must be a string, e.g. \"AVX2\"")
    flags = cpu.get("flags")
    if flags is not None and (not isinstance(flags, list) or not all(isinstance(f, str) for f in flags)):
        raise ProfileError(f"{source}: field 'provenance.cpu.flags' must be a list of strings, e.g. [\"avx2\", \"fma\"]")


def _verify(raw: Any, source: str) -> tuple[float, float, float]:
    """(per verify step, per verify row, per draft token) seconds of a profile's "verify" field (zeros if absent)."""
    if raw is None:
        return 0.0, 0.0, 0.0
    keys = ("per_verify_step_s", "per_verify_seq_s", "per_draft_token_s")
    if isinstance(raw, Mapping) and set(raw) == set(keys[1:]):  # made before the per-step part
        raw = {"per_verify_step_s": 0.0, **raw}
    if (not isinstance(raw, Mapping) or set(raw) != set(keys)
            or not all(isinstance(raw[k], (int, float)) and not isinstance(raw[k], bool) for k in keys)):
        raise ProfileError(f"{source}: field 'verify' must be {{\"per_verify_step_s\": seconds, "
                           "\"per_verify_seq_s\": seconds, \"per_draft_token_s\": seconds}")
    return float(raw[keys[0]]), float(raw[keys[1]]), float(raw[keys[2]])


def _coefs(raw: Any, where: str, source: str, required: bool = False) -> Coefs:
    if raw is None and not required:
        return ZERO
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{source}: field '{where}' is missing or not an object")
    values = dict.fromkeys(COEFFICIENTS, 0.0)
    for key, value in raw.items():
        if key not in COEFFICIENTS:
            raise ProfileError(f"{source}: unknown coefficient '{where}.{key}'; "
                               f"known: {', '.join(COEFFICIENTS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(f"{source}: field '{where}.{key}' must be a number")
        values[key] = float(value)
    return tuple(values[k] for k in COEFFICIENTS)  # type: ignore[return-value]


def check_profile_model(profile: FittedCostModel, model: str, allow_mismatch: bool = False,
                        source: str = "profile") -> None:
    """Refuse a profile made for another model than the one simulated (names both)."""
    made_for = profile.model
    if allow_mismatch or not made_for:
        return
    if _norm(made_for) != _norm(model):
        raise ProfileError(f"{source} was calibrated for model {made_for!r} but the simulated "
                           f"model is {model!r}; calibrate one for {model!r} "
                           "(`twinserve calibrate`) or allow the mismatch explicitly")


def check_profile_attention(profile: FittedCostModel, attention: Mapping[str, int], allow_mismatch: bool = False,
                            source: str = "profile") -> None:
    """Refuse a profile made for a model with another sliding window or layer count (names both).

    A profile without the record was made on a full-attention model."""
    made = profile.meta.get("attention") or {"sliding_window": 0, "num_sliding_layers": 0}
    keys = ATTENTION_KEYS if "num_layers" in made else ATTENTION_KEYS[:2]
    if allow_mismatch or all(made.get(k) == attention.get(k) for k in keys):
        return
    show = lambda a: ("full attention" if not a.get("sliding_window") else  # noqa: E731
                      f"a {a['sliding_window']}-token window on {a['num_sliding_layers']} of "
                      f"{a.get('num_layers', '?')} layers")
    raise ProfileError(f"{source} was calibrated on a model with {show(made)} but the engine's model has "
                       f"{show(attention)}; calibrate this model with `twinserve calibrate`, or pass "
                       "--allow-profile-mismatch")


def check_profile_parallelism(profile: FittedCostModel, tensor_parallel_size: int,
                              allow_mismatch: bool = False, source: str = "profile") -> None:
    """Refuse a profile calibrated at another tensor-parallel size than the engine it predicts."""
    made_at = profile.meta.get("tensor_parallel_size")
    if allow_mismatch or made_at is None or int(made_at) == int(tensor_parallel_size):
        return
    raise ProfileError(f"{source} was calibrated at tensor_parallel_size={made_at} but the engine runs "
                       f"tensor_parallel_size={tensor_parallel_size}; calibrate with "
                       f"`twinserve calibrate --tensor-parallel-size {tensor_parallel_size}`")


def check_profile_numerics(profile: FittedCostModel, device_type: str, dtype: str,
                           allow_mismatch: bool = False, source: str = "profile",
                           quantization: str | None = None) -> None:
    """Refuse a profile from another device kind, dtype or quantization: each runs other kernels."""
    prov = profile.meta.get("provenance") or {}
    made_dtype, made_device = prov.get("dtype"), prov.get("device")
    if allow_mismatch:
        return
    if made_dtype is not None and _dtype_name(str(made_dtype)) != _dtype_name(dtype):
        raise ProfileError(f"{source} was calibrated in {made_dtype} but the engine runs {dtype}; calibrate "
                           f"with `twinserve calibrate --dtype {_dtype_name(dtype)}`")
    made_quant = prov.get("quantization")
    if made_quant != quantization:
        flag = f" --quantization {quantization}" if quantization else ""
        raise ProfileError(f"{source} was calibrated with quantization {made_quant or 'none'} but the engine "
                           f"runs {quantization or 'none'}; calibrate with `twinserve calibrate{flag}`")
    if made_device is not None and (str(made_device) == "cpu") != (device_type == "cpu"):
        raise ProfileError(f"{source} was calibrated on {made_device!r} but the engine runs on {device_type}; "
                           "calibrate on this device")


def check_profile_hardware(profile: FittedCostModel, hardware: str | None, cpu: Mapping[str, Any] | None = None,
                           allow_mismatch: bool = False, source: str = "profile", suggest: bool = True) -> None:
    """Refuse to judge an engine on one machine by a profile measured on another.

    hardware: the device name as calibrate records it; cpu: a CPU engine's kernel features
    (hardware.cpu_features), compared too since one CPU name can pick other torch kernels.
    """
    made = profile.meta.get("hardware")
    if allow_mismatch or not made or not hardware:
        return
    # suggest=False: the caller names the shipped profiles it would accept itself.
    here = [f"builtin:{n} ({dtype})" for n, dtype in builtin_profiles_for(hardware, cpu)] if suggest else []
    again = ("its step prices are that machine's: calibrate on this one with `twinserve calibrate`"
             + (f" (or use {', '.join(here)}, shipped for it)" if here else "") + ", or pass --allow-profile-mismatch")
    if str(made) != str(hardware):
        raise ProfileError(f"{source} was calibrated on {made!r} but the engine runs on {hardware!r}; {again}")
    made_cpu = (profile.meta.get("provenance") or {}).get("cpu")
    if not cpu or not str(hardware).startswith("cpu"):
        return
    if not made_cpu:
        # One CPU name covers hosts with and without the kernels torch picks (a VM's name hides them).
        raise ProfileError(f"{source} was calibrated on {made!r} but recorded no CPU features (made before "
                           "calibrate recorded them), so whether this CPU runs the kernels it was timed on "
                           f"cannot be told; {again}")
    diff = []
    if made_cpu.get("capability") and cpu.get("capability") and made_cpu["capability"] != cpu["capability"]:
        diff.append(f"torch kernel level {made_cpu['capability']} there, {cpu['capability']} here")
    if made_cpu.get("flags") is not None and cpu.get("flags") is not None:
        lost = [f for f in made_cpu["flags"] if f not in cpu["flags"]]
        new = [f for f in cpu["flags"] if f not in made_cpu["flags"]]
        if lost:
            diff.append("this CPU lacks " + ", ".join(lost))
        if new:
            diff.append("this CPU adds " + ", ".join(new))
    if diff:
        raise ProfileError(f"{source} was calibrated on another {made!r}: {'; '.join(diff)}; {again}")


def _same_cpu(made_cpu: Mapping[str, Any] | None, cpu: Mapping[str, Any] | None) -> bool:
    """Whether a profile's recorded CPU features are this CPU's (True where this CPU's are unknown;
    False where only the profile's are: check_profile_hardware refuses it)."""
    if not cpu:
        return True
    if not made_cpu:
        return False
    return (made_cpu.get("capability") == cpu.get("capability")
            and sorted(made_cpu.get("flags") or []) == sorted(cpu.get("flags") or []))


def builtin_profiles_for(hardware: str | None, cpu: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """(name, dtype) of the shipped profiles calibrated on this hardware (and CPU features)."""
    out = []
    for name in builtin_profiles():
        try:
            data = json.loads((PROFILES_DIR / f"{name}.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        prov = data.get("provenance") or {}
        if hardware and data.get("hardware") == hardware and _same_cpu(prov.get("cpu"), cpu):
            out.append((name, str(prov.get("dtype", "?"))))
    return out


def _dtype_name(name: str) -> str:
    name = name.removeprefix("torch.")
    return {"bf16": "bfloat16", "fp32": "float32", "float": "float32", "fp16": "float16",
            "half": "float16"}.get(name, name)


def recorded_small_batch_rows(engine_record: Mapping[str, Any], copies: bool = True) -> int:
    """Rows up to which an engine record's CPU fp32 products used the transposed weight copies.

    Records without small_batch_rows ran them up to 4 rows where they had them."""
    if "small_batch_rows" in engine_record:
        return int(engine_record["small_batch_rows"] or 0)
    return 4 if engine_record.get("small_batch_weights", copies) else 0


def recorded_product_paths(engine_record: Mapping[str, Any]) -> dict[str, list[str]]:
    """The per-row product paths (rows 1..16, then above) of a CPU fp32 profile's engine; records from
    before they were timed say them through small_batch_rows and fp32_product_path."""
    got = engine_record.get("cpu_product_paths")
    if isinstance(got, Mapping) and "projections" in got and "head" in got:
        return {"projections": list(got["projections"]), "head": list(got["head"])}
    rows = recorded_small_batch_rows(engine_record)
    above = "prepacked" if engine_record.get("fp32_product_path") == "onednn-prepacked" else "linear"
    table = ["transposed" if r <= rows else above for r in range(1, 17)] + ["transposed" if rows > 16 else above]
    return {"projections": table, "head": list(table)}


def _path_differences(made: Mapping[str, list[str]], runs: Mapping[str, list[str]]) -> list[str]:
    """'projections of 2-16 rows: profile 'prepacked', engine 'blocked'' for each part whose paths differ
    (the first differing row's paths; '5+': from 5 rows up)."""
    out = []
    for part in ("projections", "head"):
        a, b = list(made[part]), list(runs[part])
        if len(a) != len(b):
            out.append(f"{part}: profile {a}, engine {b}")
            continue
        rows = [i for i in range(len(a)) if a[i] != b[i]]
        if rows:
            first, above = rows[0] + 1, rows[-1] == len(a) - 1
            span = ("above 16" if first == len(a) else f"{first}+") if above else \
                (str(first) if len(rows) == 1 else f"{first}-{rows[-1] + 1}")
            out.append(f"{part} of {span} rows: profile {a[rows[0]]!r}, engine {b[rows[0]]!r}")
    return out


def check_profile_code_path(profile: FittedCostModel, small_batch_rows: int, allow_mismatch: bool = False,
                            source: str = "profile", product_path: str | None = None,
                            product_paths: Mapping[str, list[str]] | None = None) -> None:
    """Refuse a CPU fp32 profile made with other product paths: per row count when the engine's plan is
    given (product_paths), else another small_batch_rows or product kernel (oneDNN's prepacked
    weights or sgemm: about 2x apart)."""
    prov = profile.meta.get("provenance") or {}
    eng = prov.get("engine")
    if allow_mismatch or not isinstance(eng, Mapping) or str(prov.get("device", "")).split(":")[0] != "cpu" \
            or _dtype_name(str(prov.get("dtype", ""))) != "float32":
        return
    if product_paths is not None:
        diff = _path_differences(recorded_product_paths(eng), product_paths)
        if diff:
            raise ProfileError(f"{source} was calibrated with other CPU product paths than the engine runs ("
                               + "; ".join(diff) + "): its steps of those rows ran another kernel; calibrate this "
                               "engine with `twinserve calibrate`, pass --cpu-product-paths, or pass "
                               "--allow-profile-mismatch")
        return
    # Profiles from before the record ran sgemm: the prepacked fp32 path came with it.
    made_path = eng.get("fp32_product_path") or "sgemm"
    if product_path and made_path != product_path:
        raise ProfileError(f"{source} was calibrated with fp32 products on {made_path!r} but the engine runs them on "
                           f"{product_path!r} (another kernel, about 2x apart on AMD CPUs; prepack_weights picks it); "
                           "calibrate this engine with `twinserve calibrate`, or pass --allow-profile-mismatch")
    made = recorded_small_batch_rows(eng)
    if made != small_batch_rows:
        raise ProfileError(f"{source} was calibrated with small_batch_rows={made} but the engine runs "
                           f"small_batch_rows={small_batch_rows} (its products of {min(made, small_batch_rows) + 1}"
                           f"-{max(made, small_batch_rows)} rows run another kernel); calibrate this engine with "
                           "`twinserve calibrate`, or pass --allow-profile-mismatch")


def check_profile_core_mode(profile: FittedCostModel, engine_core_mode: str, allow_mismatch: bool = False,
                            source: str = "profile") -> None:
    """Refuse a profile made with the engine core in another layout: each paces steps differently.

    A profile without the field was made in process."""
    made_in = (profile.meta.get("provenance") or {}).get("engine_core_mode", "inproc")
    if allow_mismatch or made_in == engine_core_mode:
        return
    raise ProfileError(f"{source} was calibrated with engine_core_mode={made_in!r} but the engine runs "
                       f"engine_core_mode={engine_core_mode!r} (the two pace steps differently); calibrate "
                       f"with `twinserve calibrate --engine-core-mode {engine_core_mode}`, or pass "
                       "--allow-profile-mismatch")


def _norm(name: str) -> str:
    return name.lower().replace("-instruct", "").replace("_", "-")
