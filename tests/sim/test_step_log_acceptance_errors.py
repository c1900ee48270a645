"""A malformed step log given as acceptance_from gets a typed error naming the file and line (exit 2 from
`simulate`, no traceback), never a raw JSONDecodeError / ValueError / AttributeError."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.sim.errors import ConfigError
from twinserve.sim.speculative import rates_from_step_log

from .test_user_errors import _run_cli

GOOD_JSON = '{"num_spec_reqs": 1, "num_draft_tokens": 4, "num_accepted_tokens": 2}'
GOOD_CSV = "1,4,2"


@pytest.mark.parametrize("name, body, line", [
    ("steps.jsonl", f"{GOOD_JSON}\n{GOOD_JSON[:-5]}\n", 2),                 # a truncated record
    ("steps.jsonl", f"{GOOD_JSON}\n\n[1, 4, 2]\n", 3),                      # not an object
    ("steps.jsonl", '{"num_spec_reqs": 1, "num_draft_tokens": "four", "num_accepted_tokens": 2}\n', 1),
    ("steps.jsonl", '{"num_spec_reqs": 1, "num_draft_tokens": 4, "num_accepted_tokens": [2]}\n', 1),
    ("steps.csv", f"num_spec_reqs,num_draft_tokens,num_accepted_tokens\n{GOOD_CSV}\n1,4,two\n", 3),
    ("steps.csv", f"num_spec_reqs,num_draft_tokens,num_accepted_tokens\n1,nan,2\n", 2),
    ("steps.csv", f"num_spec_reqs,num_draft_tokens,num_accepted_tokens\n{GOOD_CSV}\n1,inf,2\n", 3),
    ("steps.csv", f"num_spec_reqs,num_draft_tokens,num_accepted_tokens\n1,4,-2\n", 2),
], ids=["truncated", "not-object", "text-count", "list-count", "csv-text", "csv-nan", "csv-inf", "negative"])
def test_a_malformed_step_log_names_its_file_and_line(tmp_path: Path, capsys, name: str, body: str,
                                                      line: int) -> None:
    log = tmp_path / name
    log.write_text(body)
    with pytest.raises(ConfigError) as e:
        rates_from_step_log(log, 4)
    assert e.value.file == str(log) and e.value.line == line, str(e.value)
    assert e.value.field == "speculative.acceptance_from"
    study = tmp_path / "s.toml"
    study.write_text('[engine]\nmodel = "Llama-2-7B"\nhardware = "A100-80GB"\n[workload]\nnum_requests = 10\n'
                     f'[speculative]\nmethod = "ngram"\nacceptance_from = "{name}"\n')
    rc, err = _run_cli(["run", "--config", str(study), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2, err
    assert f"{log}:{line}" in err, err


def test_a_binary_file_given_as_the_step_log_is_named(tmp_path: Path) -> None:
    log = tmp_path / "steps.csv"
    log.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match="not a text file") as e:
        rates_from_step_log(log, 4)
    assert e.value.file == str(log)
