"""docs/knobs.md, made from the knob declarations: `python -m twinserve.knob_docs > docs/knobs.md`."""

from __future__ import annotations

from twinserve.core.knob_gen import knob_table

HEADER = """# Knobs

Every setting, as declared beside its field (`knob(...)`, core/knobs.py). This page is generated:
`python -m twinserve.knob_docs > docs/knobs.md` (tests/layout/test_knobs_doc.py holds it to the code).
A value out of range or not among the choices gets the same message from a flag, a study field
and `LLM(...)`: the field, what it takes, and where the value came from.
"""


def knobs_markdown() -> str:
    """The whole page."""
    from twinserve.backends.real.config import EngineArgs
    from twinserve.core.routing import ROUTERS, RouterConfig
    from twinserve.core.spec_decode import SpeculativeConfig
    from twinserve.sim.config import SECTIONS

    parts = [HEADER,
             "## Engine arguments\n\n`twinserve serve`, `generate`, `calibrate` and `fidelity` take each as "
             "`--name-with-dashes` (booleans as `--x`/`--no-x`); `LLM(...)` and `EngineArgs` take it by "
             "name. The scheduler's knobs come from `SchedulerConfig`.\n",
             knob_table(EngineArgs),
             "### `speculative_config`\n\nvLLM's dict (or its JSON text in `--speculative-config`), parsed once "
             "into a `SpeculativeConfig`; the study's `[speculative]` table shares its fields' declarations.\n",
             knob_table(SpeculativeConfig),
             "## Routers\n\n`[cluster] router` in a study, `twinserve route --router`.\n",
             knob_table(RouterConfig)]
    for name, entry in ROUTERS.items():
        if entry.options is not None:
            parts += [f"### `{name}`'s options\n\n`[cluster]` fields in a study, flags of `twinserve route` "
                      "(there a prefix block is one `--prefix-chunk-chars` chunk: `--prefix-chunks`).\n",
                      knob_table(entry.options)]
    parts.append("## Study tables\n\n`simulate --set section.field=value`, or a field of the table in a "
                 "study TOML; `simulate fields` prints these.\n")
    for name, cls in SECTIONS.items():
        parts += [f"### `[{name}]`\n", knob_table(cls)]
    return "\n".join(parts)


if __name__ == "__main__":
    print(knobs_markdown(), end="")
