"""Model specs for aiconfigurator rows: a `model_path` (e.g. deepseek-ai/DeepSeek-R1) resolved from the
config.json files the installed aiconfigurator-core ships (read in place, never copied), else from our catalog."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

from twinserve.backends.sim.catalog import ModelSpec, UnknownSpecError, all_models
from twinserve.backends.sim.hf_config import load_hf_config

# Suffixes that name a checkpoint's format or tuning, not a different shape.
_SUFFIXES = ("-Instruct", "-FP8", "-NVFP4", "-Base")


class UnknownRowModelError(UnknownSpecError):
    """A model_path that neither aiconfigurator's configs nor our catalog holds."""


def aic_model_configs_dir() -> Path | None:
    """aiconfigurator_core/model_configs of the installed package (found, not imported), or None."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent / "model_configs"
    return folder if folder.is_dir() else None


@lru_cache(maxsize=1)
def _aic_files() -> dict[str, Path]:
    """model path ('org/name') -> its config file, from the package's `org--name_config.json` files."""
    folder = aic_model_configs_dir()
    if folder is None:
        return {}
    return {p.name[:-len("_config.json")].replace("--", "/", 1): p
            for p in sorted(folder.glob("*_config.json")) if not p.name.endswith("_hf_quant_config.json")}


def _bare(name: str) -> str:
    """The name less its format suffixes (DeepSeek-R1-NVFP4 -> DeepSeek-R1)."""
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if name.lower().endswith(suffix.lower()):
                name, changed = name[:-len(suffix)], True
    return name


def _find(model_path: str) -> Path | ModelSpec | None:
    files = _aic_files()
    if model_path in files:
        return files[model_path]
    name = model_path.rsplit("/", 1)[-1]
    for candidate in (name, _bare(name)):
        low = candidate.lower()
        for key, path in files.items():  # another organisation, or Meta-Llama's prefix
            tail = key.rsplit("/", 1)[-1].lower()
            if tail == low or tail.endswith("-" + low):
                return path
        for key, spec in all_models().items():
            if key.lower() == low:
                return spec
    return None


@lru_cache(maxsize=64)
def resolve_row_model(model_path: str) -> ModelSpec:
    """The spec of a row's model_path; UnknownRowModelError naming the models available."""
    found = _find(model_path)
    if found is None:
        known = sorted(set(_aic_files()) | set(all_models()))
        raise UnknownRowModelError("model", model_path, known)
    if isinstance(found, ModelSpec):
        return found
    return load_hf_config(found, _bare(model_path.rsplit("/", 1)[-1]))
