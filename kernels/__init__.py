"""Paged KV-cache kernels: Triton implementations (``ops``) and PyTorch references (``reference``).

Importing the package is cheap and does not import Triton; import ``twinserve.kernels.ops``
for the kernels and ``twinserve.kernels.reference`` for the specification.
"""

__all__ = ["ops", "reference", "heuristics", "checks", "testing"]
