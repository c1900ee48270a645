"""A user file that is not text (a binary or non-UTF-8 file), or a folder given where a file goes, gets the
loader's typed error naming the file (and the line of the first bad byte), and `simulate` exits 2 without a
traceback: it used to let a raw UnicodeDecodeError / IsADirectoryError out. A step log's JSON cell that is
cut short is a StepLogError naming file, line and column, not a raw JSONDecodeError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinserve.backends.real.step_log import REQUIRED_COLUMNS, StepLogError, read_step_log
from twinserve.backends.sim.fitted import FittedCostModel, ProfileError
from twinserve.backends.sim.hf_config import ModelConfigError, load_hf_config
from twinserve.sim.config import load_config
from twinserve.sim.errors import ConfigError, TraceError
from twinserve.sim.traces import read_trace

from .test_user_errors import STUDY, _run_cli

BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01"

LOADERS = {
    "trace": (lambda p: list(read_trace(p)), TraceError),
    "config": (load_config, ConfigError),
    "profile": (FittedCostModel.load, ProfileError),
    "hf_config": (load_hf_config, ModelConfigError),
    "step_log": (read_step_log, StepLogError),
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("kind", ["binary", "folder"])
def test_a_file_that_is_not_text_or_is_a_folder_gets_the_loaders_typed_error(tmp_path: Path, loader: str,
                                                                               kind: str) -> None:
    load, error = LOADERS[loader]
    p = tmp_path / ("x.csv" if loader in ("trace", "step_log") else "x.json")
    if kind == "binary":
        p.write_bytes(BINARY)
    else:
        p.mkdir()
        if loader == "hf_config":  # a folder is read as an HF snapshot: its config.json is the folder here
            (p / "config.json").mkdir()
    with pytest.raises(error) as e:
        load(p)
    assert str(p) in str(e.value), str(e.value)


def test_a_trace_with_a_bad_byte_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes(b"num_prefill_tokens,num_decode_tokens\n10,5\n11,5\n1\xff2,5\n13,5\n")
    with pytest.raises(TraceError) as e:
        list(read_trace(p))
    assert e.value.line == 4 and "UTF-8" in str(e.value), str(e.value)


def test_a_trace_saved_with_a_byte_order_mark_reads_its_header(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes("num_prefill_tokens,num_decode_tokens,arrived_at\n10,5,0\n11,6,1\n".encode("utf-8-sig"))
    rows = list(read_trace(p))
    assert [(r.num_prompt_tokens, r.arrival_time) for r in rows] == [(10, 0.0), (11, 1.0)]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_step_log_json_cell_cut_short_names_file_line_and_column(tmp_path: Path, fmt: str) -> None:
    good = {c: 1 for c in REQUIRED_COLUMNS}
    if fmt == "csv":
        p = tmp_path / "steps.csv"
        head = ",".join((*REQUIRED_COLUMNS, "prefill_chunks"))
        cells = ",".join("1" for _ in REQUIRED_COLUMNS)
        p.write_text(f"{head}\n{cells},\"[[1, 2]]\"\n{cells},\"[[1, 2\"\n")
        line = 3
    else:
        p = tmp_path / "steps.jsonl"
        p.write_text(json.dumps({**good, "prefill_chunks": "[[1, 2]]"}) + "\n"
                     + json.dumps({**good, "prefill_chunks": "[[1, 2"}) + "\n")
        line = 2
    with pytest.raises(StepLogError) as e:
        read_step_log(p)
    assert f"{p}:{line}:" in str(e.value) and "'prefill_chunks'" in str(e.value), str(e.value)


def test_a_step_log_record_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    p = tmp_path / "steps.jsonl"
    p.write_text(json.dumps(list(REQUIRED_COLUMNS)) + "\n")
    with pytest.raises(StepLogError, match=rf"{p}:1: .*JSON object"):
        read_step_log(p)


@pytest.mark.parametrize("what", ["config", "trace", "profile"])
def test_simulate_exits_2_on_a_binary_user_file(tmp_path: Path, capsys, what: str) -> None:
    binary = tmp_path / "bin.dat"
    binary.write_bytes(BINARY)
    study = tmp_path / "s.toml"
    if what == "config":
        study = binary
    elif what == "trace":
        study.write_text(STUDY + f'arrival = "trace"\nprompt_dist = "trace"\noutput_dist = "trace"\n'
                         f'trace = "{binary}"\n')
    else:
        study.write_text(STUDY.replace('hardware = "H200"\n', f'hardware = "H200"\ncost_model = "fitted"\n'
                                       f'profile = "{binary}"\n'))
    rc, err = _run_cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2, err
    assert str(binary) in err, err
