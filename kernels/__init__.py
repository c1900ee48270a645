"""Paged KV-cache kernels: Triton implementations (``ops``) and PyTorch references (``reference``).

Importing the package is cheap and does not import Triton; import ``twinserve.kernels.ops``
for the kernels and ``twinserve.kernels.reference`` for the specification.
"""

if __name__ == "twinserve.kernels":
    __all__ = ["ops", "reference", "heuristics", "checks", "testing"]
else:
    # Imported as bare `kernels`: the checkout root is on sys.path (`python -c`, a notebook, `python -m` run
    # here), and that name is Hugging Face's package, which transformers imports. Step aside: load the
    # installed one in this module's place, or, with none installed, be an empty namespace package, as a
    # folder without __init__.py would be (transformers reads a file-less, version-less module as absent).
    import importlib.machinery as _machinery
    import importlib.util as _util
    import os as _os
    import sys as _sys

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _path = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _root]
    _spec = _machinery.PathFinder.find_spec(__name__, _path)
    if _spec is not None and _spec.loader is not None:
        _module = _util.module_from_spec(_spec)
        _sys.modules[__name__] = _module  # the import statement hands out what sys.modules holds
        _spec.loader.exec_module(_module)
    else:
        __path__[:] = []  # noqa: F821 (set by the import system): nothing of ours under the bare name
        del __file__
