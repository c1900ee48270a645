"""From the checkout root (cwd on sys.path), the top-level kernels/ folder must not shadow Hugging Face's `kernels`.

transformers imports `kernels` (hub_kernels); `python -c`, a notebook or `python -m` run in the checkout put
the checkout first on sys.path. The Makefile's PYTHONSAFEPATH=1 hides this, so these runs clear it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, *flags: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env_extra or {})})
    return subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_offline_example_runs_from_the_checkout_root(tmp_path: Path) -> None:
    from tests.real.conftest import make_tiny_model_dir

    model = make_tiny_model_dir(tmp_path / "tiny")
    code = ("import sys; assert sys.path[0] == '', sys.path[0]\n"
            "import transformers.integrations.hub_kernels\n"  # the import that failed
            "from twinserve import LLM, SamplingParams\n"
            f"llm = LLM(model={str(model)!r}, dtype='float32', max_model_len=64, num_gpu_blocks_override=32)\n"
            "out = llm.generate(['hello'], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)\n"
            "print(len(out[0].outputs[0].token_ids))\n")
    r = _run(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-1] == "3"


@pytest.mark.slow
def test_the_readme_offline_example_runs_verbatim_from_the_checkout_root() -> None:
    # The README's own block, as a user pastes it into `python -c` in the checkout (SmolLM2 from its package).
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "LLM(model=" in b)
    r = _run("import sys; assert sys.path[0] == '', sys.path[0]\n" + block)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Paris" in r.stdout, r.stdout[-2000:]


def test_bare_kernels_is_the_installed_package_not_the_folder(tmp_path: Path) -> None:
    # Another package named kernels, ahead of site-packages: the bare name must resolve to it.
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("MARK = 'other'\n")
    r = _run("import sys, kernels, twinserve.kernels as ours\n"
             "print(kernels.MARK, sys.modules['kernels'] is kernels, ours.__name__)\n",
             env_extra={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["other", "True", "twinserve.kernels"]


def test_bare_kernels_with_none_installed_is_an_empty_namespace() -> None:
    # -S: no site-packages, so no other kernels; transformers reads a file-less, version-less module as absent.
    r = _run("import kernels\n"
             "print(getattr(kernels, '__file__', None), getattr(kernels, '__version__', None), list(kernels.__path__))\n"
             "import kernels.ops\n", "-S")
    assert r.returncode != 0 and "No module named 'kernels.ops'" in r.stderr, r.stderr[-3000:]
    assert r.stdout.split() == ["None", "None", "[]"]
