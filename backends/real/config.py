"""Engine arguments, named as vLLM names them, and how they become the scheduler's config."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Any

import torch

from twinserve.backends.real.kv_transfer import offloading_gib, parse_kv_transfer_config
from twinserve.core.errors import InvalidConfigError
from twinserve.core.knobs import KNOB, KnobError, check_fields, knob, knob_of
from twinserve.core.sched.config import SchedulerConfig
from twinserve.core.spec_decode import SpeculativeConfig

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16, "float64": torch.float64}


_INT32_MAX = 2 ** 31 - 1
_QUANTIZATIONS = ("int8", "int4")

# Scheduler knobs whose engine default is derived: the model's length, and
# SchedulerConfig's budget with chunked prefill (else the model's length).
_DERIVED = {"max_model_len": "the model's",
            "max_num_batched_tokens": "2048 with chunked prefill, else max_model_len"}

# Scheduler fields the engine sets itself: the block count from the workers' memory, the
# sliding window and KV groups from the model (a flag could make the KV manager free blocks the model reads).
# kv_offloading_blocks comes from kv_offloading_size (GiB) and the model's page size; adp_ranks stays 1
# (the engine has no attention data parallelism).
FROM_ENGINE = frozenset({"num_blocks", "sliding_window", "kv_groups", "kv_offloading_blocks", "adp_ranks"})

# The scheduler's knobs, derived from the core's SchedulerConfig (every field but those above),
# so every policy knob the simulator has is an engine argument and a flag too. Keyword-only, so
# EngineArgs(model) keeps working.
SchedulerArgs = make_dataclass(
    "SchedulerArgs",
    [(f.name, f"{f.type} | None" if f.name in _DERIVED else f.type,
      field(default=None if f.name in _DERIVED else f.default, kw_only=True,
            metadata={KNOB: replace(knob_of(f), special={None: _DERIVED[f.name]})} if f.name in _DERIVED
            else f.metadata))
     for f in fields(SchedulerConfig) if f.name not in FROM_ENGINE],
    slots=True,
    namespace={"__doc__": "The scheduler's knobs as engine arguments (SchedulerConfig's, but FROM_ENGINE)."},
)
SchedulerArgs.__module__ = __name__  # pickled with EngineArgs into the core's and workers' processes


@dataclass(slots=True)
class EngineArgs(SchedulerArgs):
    """Everything that configures the real engine; unknown keywords are a typed error."""

    model: str = knob("smollm2", help="HF folder, .gguf file or short name", flag=False)
    tokenizer: str | None = knob(None, help="tokenizer folder", special={None: "the model's"})
    dtype: str = knob("auto", help="weights' and activations' dtype (auto: fp32 on CPU, bf16 on CUDA)",
                      choices=("auto", *_DTYPES))
    seed: int = knob(0, help="seed of the engine's random draws", range=(-(2 ** 63), 2 ** 64 - 1))
    device: str = knob("auto", help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    # KV cache size: a fixed block count wins, else GiB on CPU, else a share of GPU memory.
    num_gpu_blocks_override: int | None = knob(None, help="a fixed KV block count (wins over the memory "
                                               "knobs)", unit="blocks", range=(1, _INT32_MAX),
                                               special={None: "sized from memory"})
    kv_cache_memory_gb: float = knob(1.0, help="KV cache memory on the CPU", unit="GiB", range=(0.0, 1e6),
                                     open="lo")
    gpu_memory_utilization: float = knob(0.9, help="share of GPU memory the engine may take (KV cache "
                                         "included)", range=(0.0, 1.0), open="lo")
    # vLLM's --kv-offloading-size: host memory behind the prefix cache (core/kv/host_tier.py).
    kv_offloading_size: float = knob(0.0, help="host memory for a KV offloading tier behind the prefix "
                                     "cache (vLLM's --kv-offloading-size)", unit="GiB", range=(0.0, 1e6),
                                     open="lo", special={0: "off"})
    # vLLM's --kv-transfer-config with the OffloadingConnector: the same tier, sized in bytes (kv_transfer.py).
    kv_transfer_config: dict | None = knob(
        None, help='the host tier as vLLM\'s offloading connector JSON, e.g. {"kv_connector": '
        '"OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"cpu_bytes_to_use": '
        '1000000000}}', special={None: "off"}, parse=parse_kv_transfer_config)
    attention_backend: str = knob("auto", help="attention kernels: auto, triton or torch")
    max_logprobs: int = knob(20, help="most logprobs a request may ask for", range=(0, _INT32_MAX))
    small_batch_weights: bool = knob(True, help="CPU fp32: a transposed copy of the weights that makes "
                                     "small batches faster (more memory)")
    # None: CPU fp32 rows go by the timed product plan (product_paths.py); set, rows up to it stay on
    # the transposed copy. A profile records the plan: steps change price where it changes.
    small_batch_rows: int | None = knob(None, help="products of at most this many rows use the "
                                        "transposed copy", unit="rows",
                                        range=(1, _INT32_MAX), special={None: "timed per host"})
    # bf16 where oneDNN has bf16 kernels; fp32 where the product plan picks them (off: never a candidate).
    prepack_weights: bool = knob(True, help="CPU: weights prepacked once in oneDNN's layout (one more "
                                 "copy of the weights)")
    # Per row count 1..16 the fastest of the paths below, timed at start and cached per host
    # (backends/real/product_paths.py); a profile records the choice.
    cpu_product_paths: str = knob("auto", help="CPU: the kernel of few-row products (auto: timed on "
                                  "this host per row count; transposed: x @ W_t; prepacked: oneDNN; "
                                  "linear: F.linear; blocked: the few-row C++ kernel)",
                                  choices=("auto", "transposed", "prepacked", "linear", "blocked"))
    # 'int8': per-output-channel int8 copies (scales in bf16), used by steps of at most INT8_ROWS rows
    # (batch-1 decode reads half the bytes); 'int4': int4 projections (groups of 32, Q4_1's layout)
    # and an int8 LM head.
    quantization: str | None = knob(None, help="CPU bf16: int8 or int4 copies of the weights for small "
                                    "steps", choices=_QUANTIZATIONS, special={None: "off"})
    enforce_eager: bool = knob(False, help="CUDA: no CUDA graphs for decode steps (captured per "
                               "batch-size bucket otherwise)")
    step_log_path: str | None = knob(None, help="CSV or JSONL (by suffix) of per-step shapes and times, "
                                     "for the cost-model fit", special={None: "none written"})
    tensor_parallel_size: int = knob(1, help="tensor-parallel ranks, one worker process each (gloo on "
                                     "CPU, NCCL on CUDA)", unit="ranks", range=(1, 1024))
    distributed_executor_backend: str = knob("auto", help="uni: one worker in the engine core's "
                                             "process; mp: one process per rank; auto: mp iff TP > 1",
                                             choices=("auto", "uni", "mp"))
    # serve's 'auto': see launch.SERVE_ENGINE_CORE_MODE.
    engine_core_mode: str = knob("auto", help="where the engine core's busy loop runs: inproc (a thread), "
                                 "process (its own, over ZeroMQ), auto (offline inproc)",
                                 choices=("auto", "inproc", "process"))
    # Given as vLLM's dict or its JSON text; parsed once here (and by the flag), then an object.
    speculative_config: SpeculativeConfig | None = knob(
        None, help='speculative decoding as vLLM\'s JSON, e.g. {"method": "ngram", '
        '"num_speculative_tokens": 4}', special={None: "off"}, parse=SpeculativeConfig.from_dict)

    def __post_init__(self) -> None:
        if not isinstance(self.speculative_config, SpeculativeConfig | None):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        if self.kv_transfer_config is not None:
            self.kv_transfer_config = parse_kv_transfer_config(self.kv_transfer_config)
            gib = offloading_gib(self.kv_transfer_config, self.block_size)
            if self.kv_offloading_size and abs(self.kv_offloading_size - gib) > 1e-9:
                raise InvalidConfigError("kv_transfer_config", self.kv_transfer_config,
                                         f"the same tier size as kv_offloading_size ({self.kv_offloading_size} GiB), "
                                         f"or only one of them: it gives {gib:.4g} GiB")
            self.kv_offloading_size = gib
        self.validate()

    def validate(self) -> None:
        """Raise InvalidConfigError naming the first field outside its range (nothing is loaded yet)."""
        check_fields(self, skip=("speculative_config", "kv_transfer_config"))
        _check_str("model", self.model)
        if self.tokenizer is not None:
            _check_str("tokenizer", self.tokenizer)
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, ValueError):
                raise InvalidConfigError("device", self.device, "'auto', 'cpu', 'cuda' or 'cuda:N'") from None
        _check_str("attention_backend", self.attention_backend)
        # The scheduler's cross-field checks, with a stand-in for what only the model and the memory decide.
        self.scheduler_config(self.max_model_len or 1, 1)
        if self.kv_offloading_policy != "lru" and not self.kv_offloading_size:
            # Never silently unused (vLLM asks its offloading backend to come with a size too).
            raise InvalidConfigError("kv_offloading_policy", self.kv_offloading_policy,
                                     "only with a host tier to evict from: set kv_offloading_size (GiB) or "
                                     "kv_transfer_config, or leave the policy out")
        if self.step_log_path is not None:
            _check_str("step_log_path", self.step_log_path)
        spec = self.speculative_config
        if spec is not None and spec.method == "draft_model" and self.tensor_parallel_size != 1:
            # The draft runs whole on one worker; its layers are not sharded.
            raise InvalidConfigError("speculative_config.method", spec.method,
                                     "'ngram' when tensor_parallel_size > 1 (a draft model runs on one device)")
        if self.quantization is not None and (
                _DTYPES.get(self.dtype) is not torch.bfloat16 or not self.device.startswith(("cpu", "auto"))):
            raise InvalidConfigError("quantization", self.quantization,
                                     "with dtype 'bfloat16' on the CPU (int8/int4 weight copies "
                                     "serve bf16 activations)")

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> "EngineArgs":
        """Build from keyword arguments, naming any that are unknown."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InvalidConfigError(unknown[0], kwargs[unknown[0]], f"one of the engine args {sorted(known)}")
        if model is not None:
            kwargs["model"] = model
        try:
            return cls(**kwargs)
        except KnobError as e:  # say where the value came from
            raise KnobError(e.field, e.value, e.allowed, f"LLM({e.field}=...)") from None

    def scheduler_config(self, max_model_len: int, num_blocks: int) -> SchedulerConfig:
        """The scheduler's config: every knob from these args, the length and block count resolved."""
        knobs = {f.name: getattr(self, f.name) for f in fields(SchedulerArgs)}
        knobs["max_model_len"] = max_model_len
        if self.max_num_batched_tokens is None:
            knobs["max_num_batched_tokens"] = (
                SchedulerConfig.__dataclass_fields__["max_num_batched_tokens"].default
                if self.enable_chunked_prefill else max_model_len)
        return SchedulerConfig(num_blocks=num_blocks, **knobs)

    def resolve_device(self) -> torch.device:
        """'auto' -> cuda when present, else cpu."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_executor_backend(self) -> str:
        """'uni' or 'mp', checking the tensor-parallel size."""
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise InvalidConfigError("tensor_parallel_size", tp, "an integer >= 1")
        backend = self.distributed_executor_backend
        if backend == "auto":
            return "mp" if tp > 1 else "uni"
        if backend not in ("uni", "mp"):
            raise InvalidConfigError("distributed_executor_backend", backend, "'auto', 'uni' or 'mp'")
        if backend == "uni" and tp > 1:
            raise InvalidConfigError("distributed_executor_backend", backend,
                                     "'mp' or 'auto' when tensor_parallel_size > 1")
        return backend

    def resolve_engine_core_mode(self, default: str = "inproc") -> str:
        """'inproc' or 'process'; 'auto' takes the caller's default."""
        mode = self.engine_core_mode
        if mode == "auto":
            return default
        if mode not in ("inproc", "process"):
            raise InvalidConfigError("engine_core_mode", mode, "'auto', 'inproc' or 'process'")
        return mode

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        """'auto' -> fp32 on CPU (exact), bf16 on CUDA."""
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        if self.dtype not in _DTYPES:
            raise InvalidConfigError("dtype", self.dtype, f"'auto' or one of {sorted(_DTYPES)}")
        return _DTYPES[self.dtype]

    def resolve_small_batch_rows(self, device: torch.device | None = None) -> int:
        """Rows up to which products take the transposed weight copies: 0 where there are none
        (only CPU fp32 keeps them), else small_batch_rows or the CPU's default."""
        device = self.resolve_device() if device is None else device
        if device.type != "cpu" or not self.small_batch_weights or self.resolve_dtype(device) != torch.float32:
            return 0
        if self.small_batch_rows is not None:
            return self.small_batch_rows
        from twinserve.backends.real.models.llama import default_small_batch_rows

        return default_small_batch_rows()


def _check_str(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidConfigError(name, value, "a non-empty string")
