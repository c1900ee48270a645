"""One device: loads the weights, sizes the KV cache from a memory budget, runs the model runner."""

from __future__ import annotations

import threading
import time
import weakref
from itertools import accumulate
from typing import Any

import torch

from twinserve.core.errors import InvalidConfigError
from twinserve.core.kv.groups import kv_cache_groups
from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput
from twinserve.core.structured_output import StructuredOutputSpec
from twinserve.backends.real.attention import get_attention_backend
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.core_client import kv_sliding_window
from twinserve.backends.real.cuda_graphs import DecodeGraphs
from twinserve.backends.real.model_runner import ModelRunner, StepShape
from twinserve.backends.real.models.architectures import CausalLM
from twinserve.backends.real.models.config import ModelConfig
from twinserve.backends.real.models import llama
from twinserve.backends.real.models.loader import load_gguf, load_hf_folder
from twinserve.backends.real.models.parallel import TensorParallel, shard_llama
from twinserve.backends.real.models.registry import ModelSource
from twinserve.backends.real.product_paths import resolve_plan, warn_slow_bf16
from twinserve.backends.real.spec.draft_model import resolve_draft_model
from twinserve.core.spec_decode import SpeculativeConfig

_GIB = 1 << 30


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """K and V of one token across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem


def kv_page_bytes(cfg: ModelConfig, dtype: torch.dtype, block_size: int) -> int:
    """One page of the KV pool: block_size tokens of one KV group's layers (all layers if one group)."""
    layers = len(kv_cache_groups(cfg.layer_windows or [None] * cfg.num_hidden_layers)[0].layers)
    return kv_bytes_per_token(cfg, dtype) // cfg.num_hidden_layers * layers * block_size


def kv_blocks_in_budget(budget: float, per_block: int, utilization: float, total: int) -> int:
    """KV blocks a device's leftover budget holds; none is a start-up error naming gpu_memory_utilization.

    (An engine that went on with 0 blocks captured its decode graphs over an empty pool: an illegal
    memory access on an H200, seen with a second engine in the same process.)
    """
    n = int(budget // per_block) if budget > 0 else 0
    if n < 1:
        raise InvalidConfigError(
            "gpu_memory_utilization", utilization,
            f"a larger share, or less else on the device: at {utilization} of its {total / _GIB:.1f} GiB, the "
            f"weights, the largest step's activations and other processes or engines leave "
            f"{max(budget, 0.0) / _GIB:.3f} GiB for the KV cache, under one block ({per_block} bytes)")
    return n


def _weak_call(method: Any) -> Any:
    """method, holding its object weakly: a bound method kept by the runner made worker and runner a
    cycle, so a dropped engine's weights lived until the next full collection (issue 53 item 16)."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        if bound is None:
            raise RuntimeError("the worker this call belongs to has been released")
        return bound(*args)

    return call


class Worker:
    """Owns a device, the model on it and the KV cache tensors."""

    def __init__(self, args: EngineArgs, max_model_len: int, stop_ids: list[int],
                 model: CausalLM | None = None, source: ModelSource | None = None,
                 tp: TensorParallel | None = None) -> None:
        self.args = args
        self.device = args.resolve_device()
        self.dtype = args.resolve_dtype(self.device)
        self.max_model_len = max_model_len
        if model is None:
            if source is None:
                raise InvalidConfigError("model", None, "a ModelSource or a built model")
            loader = load_gguf if source.is_gguf else load_hf_folder
            model = loader(source.path, max_model_len, self.dtype)
        if tp is not None and tp.world_size > 1:
            shard_llama(model, tp)
        self.tp = tp
        # Seconds in collectives during the last step (tensor parallelism).
        self.last_comm_time = 0.0
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        if self.device.type == "cpu" and self.dtype == torch.bfloat16 and args.quantization is None:
            warn_slow_bf16(self.model.config)
        # CPU fp32 (or a named path): each row count's product path, timed on this host (product_paths.py).
        self.product_plan = resolve_plan(args, self.model.config, self.device, self.dtype)
        small_rows = args.resolve_small_batch_rows(self.device)
        if self.product_plan is not None:
            self.model.set_product_plan(self.product_plan.projections, self.product_plan.head)
            small_rows = self.product_plan.small_batch_rows()
        else:
            # Only fp32 gains from the transposed copies (docs/speed.md).
            if small_rows:
                self.model.add_small_batch_weights(small_rows)
            if self._prepack():
                self.model.add_packed_weights()
        if args.quantization in ("int8", "int4"):
            kernels = ("_weight_int8pack_mm",) + (("_weight_int4pack_mm_for_cpu",) if args.quantization == "int4" else ())
            if self.device.type != "cpu" or self.dtype != torch.bfloat16 \
                    or not all(hasattr(torch.ops.aten, k) for k in kernels):
                raise InvalidConfigError("quantization", args.quantization,
                                         f"a CPU bf16 engine on a torch with aten.{' and aten.'.join(kernels)}")
            if args.quantization == "int8":
                self.model.add_int8_weights()
            else:
                self.model.add_int4_weights()
        self.backend = get_attention_backend(args.attention_backend, self.device)
        spec = args.speculative_config
        self.draft_model = self._load_draft(spec, small_rows) if spec is not None and spec.method == "draft_model" else None
        self.runner = ModelRunner(self.model, self.backend, self.device, args.block_size,
                                  max_model_len, args.max_num_seqs, stop_ids, compile_grammar=_weak_call(self.compile_grammar),
                                  speculative_config=spec, draft_model=self.draft_model)
        self.num_blocks = 0
        # Host-tier blocks (init_kv_cache; 0 = no tier).
        self.num_host_blocks = 0
        self.model_source_path = source.path if source is not None else None
        self.peak_activation_bytes = 0
        self._source = source
        self._stop_ids = list(stop_ids)
        self._grammars: Any = None
        self._grammars_lock = threading.Lock()

    def _load_draft(self, spec: SpeculativeConfig, small_rows: int) -> CausalLM:
        """The draft model, through the same registry and loaders as the target, checked against it."""
        source, _ = resolve_draft_model(spec.model, self.model.config, self.max_model_len,
                                        kv_sliding_window(self.model.config))
        loader = load_gguf if source.is_gguf else load_hf_folder
        draft = loader(source.path, self.max_model_len, self.dtype).to(device=self.device, dtype=self.dtype).eval()
        plan = resolve_plan(self.args, draft.config, self.device, self.dtype)
        if plan is not None:
            draft.set_product_plan(plan.projections, plan.head)
            return draft
        if small_rows:
            draft.add_small_batch_weights(small_rows)
        if self._prepack():
            draft.add_packed_weights()
        return draft

    def _prepack(self) -> bool:
        """Whether bf16 products run on oneDNN-prepacked weights (CPU fp32 follows its product plan)."""
        if self.device.type != "cpu" or not self.args.prepack_weights:
            return False
        return self.dtype == torch.bfloat16 and llama.packed_bf16_supported()

    def compile_grammar(self, spec: StructuredOutputSpec) -> Any:
        """spec's grammar compiled here, for a spec from another process (compiled grammars do not serialize)."""
        with self._grammars_lock:
            if self._grammars is None:
                if self._source is None:
                    raise InvalidConfigError("structured_output", spec.kind,
                                             "a grammar compiled by the engine (this worker has no model "
                                             "path to load a tokenizer from)")
                from twinserve.backends.real.structured.compiler import GrammarCompilerCache
                from twinserve.backends.real.tokenizer import load_tokenizer

                tokenizer = load_tokenizer(self._source, self.args.tokenizer)
                self._grammars = GrammarCompilerCache(tokenizer, self.model.config.vocab_size, self._stop_ids)
        return self._grammars.compile(spec)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token occupies (the draft model's own cache included)."""
        n = kv_bytes_per_token(self.model.config, self.dtype)
        if self.draft_model is not None:
            n += kv_bytes_per_token(self.draft_model.config, self.dtype)
        return n

    def determine_num_blocks(self) -> int:
        """Blocks that fit: a fixed count, else GiB on CPU, else free GPU memory after a profile run."""
        a = self.args
        per_block = kv_page_bytes(self.model.config, self.dtype, a.block_size)
        if self.draft_model is not None:
            # The draft's own tensors hold every draft layer for each page id of group 0.
            per_block += kv_bytes_per_token(self.draft_model.config, self.dtype) * a.block_size
        if a.num_gpu_blocks_override is not None:
            return a.num_gpu_blocks_override
        if self.device.type == "cuda":
            if not 0.0 < a.gpu_memory_utilization <= 1.0:
                raise InvalidConfigError("gpu_memory_utilization", a.gpu_memory_utilization, "a number in (0, 1]")
            self._profile_run()
            free, total = torch.cuda.mem_get_info(self.device)
            used_by_others = total - free - torch.cuda.memory_reserved(self.device)
            budget = (a.gpu_memory_utilization * total - used_by_others - torch.cuda.memory_allocated(self.device)
                      - self.peak_activation_bytes)
            return kv_blocks_in_budget(budget, per_block, a.gpu_memory_utilization, total)
        if a.kv_cache_memory_gb <= 0:
            raise InvalidConfigError("kv_cache_memory_gb", a.kv_cache_memory_gb, "a number > 0")
        return max(int(a.kv_cache_memory_gb * _GIB // per_block), 1)

    def _profile_run(self) -> None:
        """Measure the memory peak of the largest step the engine can run, on dummy data.

        The sampler's top-k/top-p sorts on max_num_seqs rows are the biggest temporaries; the throwaway
        cache is not counted.
        """
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        cache_bytes = profile_step_memory(self.runner, self.args, self.max_model_len)
        torch.cuda.synchronize(self.device)
        self.peak_activation_bytes = max(0, torch.cuda.max_memory_allocated(self.device) - before - cache_bytes)
        torch.cuda.empty_cache()

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate the paged K/V tensors; on CUDA capture the decode graphs over them."""
        self.num_blocks = num_blocks
        self.runner.init_kv_cache(num_blocks, self.dtype)
        if self.args.kv_offloading_size:
            # KV groups share the tensors (a block id is one group's page), so one mirror serves them all.
            tc = self.args.kv_transfer_config
            field = (None if tc is None else ("kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use",
                                              tc["kv_connector_extra_config"]["cpu_bytes_to_use"]))
            self.num_host_blocks = self.runner.init_host_tier(self.args.kv_offloading_size, field)
        # Captured graphs read a static block table and slot mapping per KV group.
        if (self.device.type == "cuda" and not self.args.enforce_eager
                and getattr(self.backend, "supports_cuda_graphs", False)):
            r = self.runner
            r.graphs = DecodeGraphs(self.model, self.backend, r.kv_caches, self.device, r.max_num_seqs,
                                    r.max_blocks_per_req, self.max_model_len, capture=True,
                                    num_groups=len(r.kv_groups))
            r.graphs.capture_all()

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; step_time is its wall time (the token read-back waits for the device)."""
        t0 = time.perf_counter()
        out = self.runner.execute_model(so)
        out.step_time = time.perf_counter() - t0
        self.last_comm_time = self.tp.take_comm_time() if self.tp is not None else 0.0
        return out

    def host_tier(self) -> tuple[int, int]:
        """(host-tier blocks, bytes per block): (0, 0) without a tier."""
        h = self.runner.host_kv
        return (0, 0) if h is None else (h.num_blocks, h.page_bytes)

    @property
    def last_step_shape(self) -> StepShape:
        """The shape of the step just run."""
        return self.runner.last_shape

    @property
    def last_step_timing(self) -> tuple[float, float, float]:
        """(prepare_s, forward_s, sample_s) of the step just run, when timing is on."""
        return self.runner.last_timing

    def set_timing(self, on: bool) -> None:
        """Time the phases of each step."""
        self.runner.timing = on

def profile_step_memory(runner: ModelRunner, args: EngineArgs, max_model_len: int) -> int:
    """Run the biggest prefill, decode and sampling step on dummy data; returns the throwaway cache's bytes.

    Device-agnostic so the shapes can be checked on CPU; the caller reads the memory peak.
    """
    from twinserve.core.sampling_params import SamplingParams
    from twinserve.backends.real.attention import AttentionMetadata
    from twinserve.backends.real.sampler import SamplingRow

    model, dev, bs = runner.model, runner.device, runner.block_size
    cfg = model.config
    tokens = max(1, args.max_num_batched_tokens or 2048)
    seqs = max(1, min(args.max_num_seqs, tokens))
    ctx = min(max_model_len, max(bs, tokens))
    # One prefill of `tokens`, then `seqs` decodes of ctx context sharing its blocks.
    nblk = -(-max(tokens, ctx) // bs)
    dtype = model.embed_tokens.weight.dtype
    shape = (nblk, bs, cfg.num_key_value_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=dtype, device=dev), torch.zeros(shape, dtype=dtype, device=dev))
              for _ in range(cfg.num_hidden_layers)]
    cache_bytes = 2 * len(caches) * caches[0][0].numel() * caches[0][0].element_size()
    table = torch.arange(nblk, dtype=torch.int32, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    with torch.inference_mode():
        for q_lens, seq_len in (([min(tokens, max_model_len)], None), ([1] * seqs, ctx)):
            n = len(q_lens)
            lens = [q_lens[0]] if seq_len is None else [seq_len] * n
            total = sum(q_lens)
            meta = AttentionMetadata(
                total, 0 if seq_len is None else n,
                torch.tensor([0] + list(accumulate(q_lens)), **i32), torch.tensor(lens, **i32),
                table.unsqueeze(0).expand(n, nblk).contiguous(),
                torch.arange(total, dtype=torch.long, device=dev) % (nblk * bs) if seq_len is None
                else torch.full((n,), ctx - 1, dtype=torch.long, device=dev),
                max(q_lens), max(lens) if seq_len is None else max_model_len, q_lens, lens)
            runner.backend.plan(meta, bs, cfg.num_key_value_heads)
            positions = (torch.arange(total, device=dev) if seq_len is None
                         else torch.full((n,), ctx - 1, dtype=torch.long, device=dev))
            hidden = model(torch.zeros(total, dtype=torch.long, device=dev), positions, caches, meta, runner.backend)
            ends = torch.tensor(list(accumulate(q_lens)), device=dev) - 1
            logits = model.compute_logits(hidden[ends])
        params = SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, logprobs=1)
        rows = [SamplingRow(params, [0, 1], 1, i, []) for i in range(logits.shape[0])]
        runner.sampler(logits, rows)
    del caches
    return cache_bytes
