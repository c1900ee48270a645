"""Where a result came from: the code's git commit, recorded in profiles and study journals."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """The short commit of the tree this package runs from; TWINSERVE_GIT_COMMIT overrides it (set
    where the tree's .git is not its own); None outside a git checkout."""
    if os.environ.get("TWINSERVE_GIT_COMMIT"):
        return os.environ["TWINSERVE_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
