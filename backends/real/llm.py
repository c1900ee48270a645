"""The offline API: LLM(model=..., **engine_args).generate(...) and .chat(...)."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from twinserve.core.errors import InvalidRequestError, TwinserveError
from twinserve.core.sampling_params import SamplingParams
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.engine import LLMEngine, PromptType
from twinserve.backends.real.outputs import RequestOutput

Messages = list[dict[str, Any]]


class LLM:
    """Batch generation over the real engine, in the style of vLLM's offline LLM class."""

    def __init__(self, model: str = "smollm2", **engine_args: Any) -> None:
        self.engine_args = EngineArgs.from_kwargs(model=model, **engine_args)
        self.llm_engine = LLMEngine(self.engine_args)
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        """Wrap an already built engine (tests build one around an in-memory model)."""
        self = cls.__new__(cls)
        self.engine_args = engine.args
        self.llm_engine = engine
        self._ids = itertools.count()
        return self

    def get_tokenizer(self) -> Any:
        """The engine's tokenizer."""
        return self.llm_engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            params = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidRequestError(f"{len(params)} sampling params for {len(prompts)} prompts",
                                          param="sampling_params")
        return self._run(prompts, params, use_tqdm)

    def chat(self, messages: Messages | Sequence[Messages],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             chat_template_kwargs: dict[str, Any] | None = None) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the chat template."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        kwargs = dict(chat_template_kwargs or {})
        prompts = [self.llm_engine.chat_prompt(c, add_generation_prompt=add_generation_prompt, **kwargs)
                   for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(self, prompts: list[PromptType], params: list[SamplingParams], use_tqdm: bool
             ) -> list[RequestOutput]:
        engine = self.llm_engine
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        added: list[str] = []
        try:
            for rid, prompt, sp in zip(ids, prompts, params):
                engine.add_request(rid, prompt, sp, output_kind="final_only")
                added.append(rid)
        except TwinserveError:
            engine.abort_request(added)
            raise
        results: dict[str, RequestOutput] = {}
        bar = _progress(len(ids)) if use_tqdm else None
        try:
            while len(results) < len(ids):
                for out in engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
                            _postfix(bar, results)
        except BaseException:
            engine.abort_request([i for i in ids if i not in results])
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in ids]


def _progress(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)


def _postfix(bar: Any, results: dict[str, RequestOutput]) -> None:
    elapsed = bar.format_dict.get("elapsed") or 0.0
    if elapsed > 0:
        toks = sum(len(c.token_ids) for r in results.values() for c in r.outputs)
        bar.set_postfix_str(f"output {toks / elapsed:.1f} tok/s")
