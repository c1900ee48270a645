"""Worker counts of a disaggregated row from the file's other record of the same measurement.

aiconfigurator-core's silicon_sample.csv holds some InferenceX runs twice: once from an InferenceMAX dump
(`source_file=2026-03-25.csv` / `2026-04-06.csv`, model DeepSeek-R1, no `prefill_num_workers` /
`decode_num_workers`, attention DP written as 1) and once from InferenceX's database dump
(`db-dump/2026-04-27; config_id=...`, model written DeepSeek-V3, with both worker counts and each side's
attention DP). The two records of one run carry the same measured TTFT and TPOT to every printed digit
(e.g. H200 TensorRT-LLM FP8 1k/1k at 36 clients: 622.888743 ms / 13.382414 ms in both, the db-dump's
`measured=2026-03-23` config 590 and the dump row `measured=2026-03-23T13:00:07Z`). Over the file, each of
the 306 development rows that have such a twin has exactly one (one layout), so the twin is the run's own
record of how many workers it ran, not an estimate.

A twin must agree on backend, system, precision, ISL, OSL, client count and both measured figures, and its
model must be the row's or one of the same weights' shape (_SAME_SHAPE: DeepSeek-V3 and DeepSeek-R1 share
config.json's DeepseekV3ForCausalLM dimensions; InferenceX ran deepseek-ai/DeepSeek-R1-0528). Only the
twin's layout columns are read (its measured figures serve as the key; no error of any row is used).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

# The layout columns a twin lends: each side's worker count and parallel sizes.
LAYOUT_FIELDS = tuple(f"{side}_{f}" for side in ("prefill", "decode")
                      for f in ("num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"))
# What makes two records one measurement.
TWIN_KEY = ("backend", "system", "precision", "isl", "osl", "concurrency", "silicon_ttft_ms", "silicon_tpot_ms")
# The measured figures are compared at 0.1 microsecond: the two dumps print one run's figures with
# different trailing float digits (622.88874298 vs 622.888743), never a different 4th decimal.
_DECIMALS = 4
TWIN_ID = "twin_id"  # the column naming the twin's id; its layout goes in twin_<field>
# Models whose checkpoints share one architecture and shape (config.json's DeepseekV3ForCausalLM, 61 layers,
# hidden 7168, 256 routed experts: deepseek-ai/DeepSeek-V3 and deepseek-ai/DeepSeek-R1 on Hugging Face).
_SAME_SHAPE = (frozenset({"DeepSeek-R1", "DeepSeek-V3"}),)


def _same_shape(a: str, b: str) -> bool:
    return a == b or any(a in s and b in s for s in _SAME_SHAPE)


def add_twins(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with TWIN_ID and twin_<field> columns on each disaggregated row that lacks worker counts and has
    exactly one twin layout (NaN elsewhere). `df` needs `model` and `concurrency` (validate_rows.prepare_rows)."""
    out = df.copy()
    out[TWIN_ID] = None
    for f in LAYOUT_FIELDS:
        out[f"twin_{f}"] = float("nan")
    if not set(TWIN_KEY + LAYOUT_FIELDS + ("mode", "model", "id")).issubset(df.columns):
        return out
    disagg = df[df["mode"] == "disagg"]
    counted = disagg["prefill_num_workers"].notna() & disagg["decode_num_workers"].notna()
    given, missing = disagg[counted], disagg[~counted]
    given = given.dropna(subset=["silicon_ttft_ms", "silicon_tpot_ms", "concurrency"])
    given = given.assign(**{c: given[c].round(_DECIMALS) for c in ("silicon_ttft_ms", "silicon_tpot_ms")})
    if given.empty or missing.empty:
        return out
    groups = given.groupby(list(TWIN_KEY), sort=False)
    for idx, row in missing.iterrows():
        k = tuple(round(row[c], _DECIMALS) if c.startswith("silicon_") else row[c] for c in TWIN_KEY)
        if any(pd.isna(v) for v in k):
            continue
        try:
            cand = groups.get_group(k)
        except KeyError:
            continue
        cand = cand[[_same_shape(str(row["model"]), str(m)) for m in cand["model"]]]
        layouts = cand[list(LAYOUT_FIELDS)].fillna(-1).drop_duplicates()
        if len(layouts) != 1:
            continue  # none, or records of one measurement that disagree on the workers: keep the assumption
        twin = cand.iloc[0]
        out.at[idx, TWIN_ID] = str(twin["id"])
        for f in LAYOUT_FIELDS:
            out.at[idx, f"twin_{f}"] = twin[f]
    return out


# InferenceX's database dump holds no MTP run: of the DeepSeek-R1 InferenceMAX-dump rows whose fitting matrix entries
# (sim/validate_inferencex.py candidates) all ran MTP, none (0 of 328) has a db-dump twin, where 232 of the 397 whose
# entries all ran plain have one (counted on aiconfigurator-core 0.12's silicon_sample.csv, 2026-12-06; layouts
# and sources only, no measured figure compared but as the twin key). A dump row's db-dump twin is thus a plain
# run. Where a client count's entries include a plain one and an MTP one (e.g. H100 TensorRT-LLM 1k/1k at 6
# clients: nvidia-master.yaml @0004cf5's 3-decode-worker TEP 16 entries with and without MTP 3), the dumps hold
# both runs, and the one without a twin measured the same day with other figures is not the twinned plain
# entry's run: PLAIN_SIBLING columns carry that twin's layout, and validate_inferencex.candidates drops the
# plain entries of that layout from the row's fits.
PLAIN_SIBLING = "plain_sib_"  # prefix of the columns holding the db-dump twin layout of a same-key plain run
_DB_DUMP_TWIN = "dsr1_"  # a db-dump record's id prefix (validate_inferencex._is_db_dump_twin)
_DUMP_PREFIXES = ("source_file=2026-03-25.csv", "source_file=2026-04-06.csv")
_RUN_KEY = ("backend", "system", "precision", "isl", "osl", "concurrency")


def measured_day(src: Any) -> str:
    """The `measured=YYYY-MM-DD` day of a dump row's silicon_data_source ('' where none)."""
    for part in str(src).split(";"):
        key, _, value = part.strip().partition("=")
        if key == "measured":
            return value[:10]
    return ""


def add_plain_siblings(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with PLAIN_SIBLING<field> columns on each InferenceMAX-dump disaggregated row without a db-dump twin
    that shares its configuration, client count and measured day with dump rows of other measured figures whose
    db-dump twins all have one layout (that layout; NaN elsewhere). Needs add_twins' columns."""
    out = df.copy()
    for f in LAYOUT_FIELDS:
        out[f"{PLAIN_SIBLING}{f}"] = float("nan")
    if TWIN_ID not in df.columns or not set(_RUN_KEY + ("mode", "silicon_data_source")).issubset(df.columns):
        return out
    dump = df[(df["mode"] == "disagg") & df["silicon_data_source"].astype(str).str.startswith(_DUMP_PREFIXES)]
    if dump.empty:
        return out
    dump = dump.assign(_day=dump["silicon_data_source"].map(measured_day),
                       _twin=dump[TWIN_ID].map(lambda t: isinstance(t, str) and t.startswith(_DB_DUMP_TWIN)))
    for _, group in dump.groupby(list(_RUN_KEY) + ["_day"], sort=False):
        twinned = group[group["_twin"]]
        if twinned.empty or len(twinned) == len(group):
            continue
        figures = {(round(t, _DECIMALS), round(p, _DECIMALS))
                   for t, p in zip(twinned["silicon_ttft_ms"], twinned["silicon_tpot_ms"])}
        layouts = twinned[[f"twin_{f}" for f in LAYOUT_FIELDS]].fillna(-1).drop_duplicates()
        if len(layouts) != 1:
            continue
        for idx, row in group[~group["_twin"]].iterrows():
            if (round(row["silicon_ttft_ms"], _DECIMALS), round(row["silicon_tpot_ms"], _DECIMALS)) in figures:
                continue  # the twinned run itself, printed without its twin
            for f in LAYOUT_FIELDS:
                out.at[idx, f"{PLAIN_SIBLING}{f}"] = twinned.iloc[0][f"twin_{f}"]
    return out


def twin_of(row: pd.Series) -> str | None:
    """The id of the row's twin record (add_twins), or None."""
    v = row.get(TWIN_ID)
    return v if isinstance(v, str) and v else None
