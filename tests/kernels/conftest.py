"""Kernel tests run Triton's interpreter on CPU; it must be on before triton is imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# bf16 arithmetic is silently wrong in the interpreter, so CPU tests cover fp32 and fp16.
DTYPES = (torch.float32, torch.float16)
TOLERANCE = {torch.float32: 2e-5, torch.float16: 1e-2}


def assert_close_rows(actual: torch.Tensor, expected: torch.Tensor, num_rows: int) -> None:
    """Compare the first ``num_rows`` token rows with a dtype-dependent tolerance."""
    tol = TOLERANCE[actual.dtype]
    torch.testing.assert_close(actual[:num_rows].float(), expected[:num_rows].float(), atol=tol, rtol=tol)


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator so each test's batch is reproducible."""
    return torch.Generator().manual_seed(1234)
