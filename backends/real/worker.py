"""One device: loads the weights, sizes the KV cache from a memory budget, runs the model runner."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from ...core.errors import InvalidConfigError
from ...core.sched.output import ModelRunnerOutput, SchedulerOutput
from ...core.structured_output import StructuredOutputSpec
from .attention import get_attention_backend
from .config import EngineArgs
from .model_runner import ModelRunner, StepShape
from .models.config import LlamaConfig
from .models.llama import LlamaForCausalLM
from .models.loader import load_gguf, load_hf_folder
from .models.parallel import TensorParallel, shard_llama
from .models.registry import ModelSource

_GIB = 1 << 30


def kv_bytes_per_token(cfg: LlamaConfig, dtype: torch.dtype) -> int:
    """K and V of one token across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem


class Worker:
    """Owns a device, the model on it and the KV cache tensors."""

    def __init__(self, args: EngineArgs, max_model_len: int, stop_ids: list[int],
                 model: LlamaForCausalLM | None = None, source: ModelSource | None = None,
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
        # Seconds of the last step spent in collectives (tensor parallelism), for the step log.
        self.last_comm_time = 0.0
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        if self.device.type == "cpu" and args.small_batch_weights:
            self.model.add_small_batch_weights()
        self.backend = get_attention_backend(args.attention_backend, self.device)
        self.runner = ModelRunner(self.model, self.backend, self.device, args.block_size,
                                  max_model_len, args.max_num_seqs, stop_ids, compile_grammar=self.compile_grammar)
        self.num_blocks = 0
        self.model_source_path = source.path if source is not None else None
        self._source = source
        self._stop_ids = list(stop_ids)
        self._grammars: Any = None
        self._grammars_lock = threading.Lock()

    def compile_grammar(self, spec: StructuredOutputSpec) -> Any:
        """spec's grammar compiled in this process, for a spec that came from another process.

        Compiled grammars do not serialize, so with the engine core or this worker in a process of
        their own the spec arrives bare (the front end compiled it too, to validate it); the
        tokenizer named by the engine args is loaded here once and grammars are cached by spec.
        """
        with self._grammars_lock:
            if self._grammars is None:
                if self._source is None:
                    raise InvalidConfigError("structured_output", spec.kind,
                                             "a grammar compiled by the engine (this worker has no model "
                                             "path to load a tokenizer from)")
                from .structured.compiler import GrammarCompilerCache
                from .tokenizer import load_tokenizer

                tokenizer = load_tokenizer(self._source, self.args.tokenizer)
                self._grammars = GrammarCompilerCache(tokenizer, self.model.config.vocab_size, self._stop_ids)
        return self._grammars.compile(spec)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token occupies."""
        return kv_bytes_per_token(self.model.config, self.dtype)

    def determine_num_blocks(self) -> int:
        """Blocks that fit the budget: a fixed count, else GiB on CPU, else GPU free memory after a profile run."""
        a = self.args
        per_block = self.kv_bytes_per_token * a.block_size
        if a.num_gpu_blocks_override is not None:
            return a.num_gpu_blocks_override
        if self.device.type == "cuda":
            if not 0.0 < a.gpu_memory_utilization <= 1.0:
                raise InvalidConfigError("gpu_memory_utilization", a.gpu_memory_utilization, "a number in (0, 1]")
            self._profile_run()
            free, total = torch.cuda.mem_get_info(self.device)
            used_by_others = total - free - torch.cuda.memory_reserved(self.device)
            budget = a.gpu_memory_utilization * total - used_by_others - torch.cuda.max_memory_allocated(self.device)
            return max(int(budget // per_block), 0)
        if a.kv_cache_memory_gb <= 0:
            raise InvalidConfigError("kv_cache_memory_gb", a.kv_cache_memory_gb, "a number > 0")
        return max(int(a.kv_cache_memory_gb * _GIB // per_block), 1)

    def _profile_run(self) -> None:
        """A forward of max_num_batched_tokens dummy tokens, so activation peaks are measured."""
        tokens = self.args.max_num_batched_tokens or 2048
        torch.cuda.reset_peak_memory_stats(self.device)
        with torch.inference_mode():
            ids = torch.zeros(tokens, dtype=torch.long, device=self.device)
            h = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            self.model.compute_logits(h[-min(tokens, self.args.max_num_seqs):])
        torch.cuda.synchronize(self.device)

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate the paged K/V tensors."""
        self.num_blocks = num_blocks
        self.runner.init_kv_cache(num_blocks, self.dtype)

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; step_time is the measured wall time of the whole step."""
        t0 = time.perf_counter()
        out = self.runner.execute_model(so)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out.step_time = time.perf_counter() - t0
        self.last_comm_time = self.tp.take_comm_time() if self.tp is not None else 0.0
        return out

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
