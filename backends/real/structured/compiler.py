"""Compiles structured-output specs into xgrammar grammars, once per distinct spec.

Compilation can take from microseconds (a regex) to seconds (a large JSON schema), so the server
calls `compile` on a worker thread before a request enters the engine; the engine thread only
ever sees compiled grammars. Results are kept in an LRU cache keyed by (kind, value), so a
schema sent by every request of a workload is compiled once.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from twinserve.core.errors import InvalidRequestError
from twinserve.core.structured_output import StructuredOutputSpec


class GrammarCompilerCache:
    """xgrammar's compiler for one tokenizer, with an LRU of compiled grammars."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], max_entries: int = 256) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_token_ids or None)
        # One compiler thread: the machine's cores belong to the forward pass.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def compile(self, spec: StructuredOutputSpec) -> Any:
        """The compiled grammar of `spec` (also stored on spec.compiled); InvalidRequestError if it is bad."""
        if spec.compiled is not None:
            return spec.compiled
        spec.validate()
        key = spec.cache_key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                spec.compiled = hit
                return hit
        compiled = self._compile(spec)
        self._check_satisfiable(spec, compiled)
        with self._lock:
            self.misses += 1
            self._cache[key] = compiled
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        spec.compiled = compiled
        return compiled

    def _compile(self, spec: StructuredOutputSpec) -> Any:
        c = self._compiler
        try:
            if spec.kind == "json":
                schema = json.loads(spec.value) if isinstance(spec.value, str) else spec.value
                if not isinstance(schema, dict):
                    raise ValueError("a JSON schema must be a JSON object")
                # Compact JSON: no free whitespace, so a model cannot wander in blank space.
                return c.compile_json_schema(json.dumps(schema), any_whitespace=False)
            if spec.kind == "json_object":
                # An object, as OpenAI's json_object mode promises (the builtin JSON grammar takes any value).
                return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == "regex":
                return c.compile_regex(spec.value)
            if spec.kind == "choice":
                return c.compile_regex("|".join(re.escape(v) for v in spec.value))
            return c.compile_grammar(spec.value)
        except Exception as e:  # xgrammar reports bad schemas/regexes/grammars as several exception types
            raise InvalidRequestError(f"{spec.param}: cannot compile the {spec.kind} constraint: {e}",
                                      param=spec.param) from None

    def _check_satisfiable(self, spec: StructuredOutputSpec, compiled: Any) -> None:
        """InvalidRequestError when the constraint allows no first token at all (e.g. an empty class)."""
        xgr = self._xgr
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, self._vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        if not bool((bitmask != 0).any()):
            raise InvalidRequestError(f"{spec.param}: the {spec.kind} constraint can never be matched: it allows "
                                      "no token, not even the end of the text", param=spec.param)
