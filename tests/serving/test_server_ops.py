"""Operating the server: short 503 bodies (the log has the traceback), vLLM's flags, and vLLM's metric names."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import httpx
import pytest

from twinserve.core.errors import InvalidConfigError

from .conftest import prometheus_series, start_server

WORKER_TRACE = ("worker rank 1 failed during step:\nTraceback (most recent call last):\n"
                '  File "/home/someone/twinserve/backends/real/worker.py", line 88, in execute\n'
                "    raise RuntimeError('CUDA error')\nRuntimeError: CUDA error")


def test_a_dead_engine_answers_503_with_a_short_message_and_logs_the_traceback(
        tiny_model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = start_server(tiny_model_dir, engine_core_mode="inproc")
    try:
        def broken_step() -> list:
            raise RuntimeError(WORKER_TRACE)

        with caplog.at_level(logging.ERROR, logger="twinserve.serve"):
            s.engine.step = broken_step
            r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2},
                           timeout=30)
            health = httpx.get(s.url + "/health", timeout=10)
        for resp in (r, health):
            assert resp.status_code == 503
            msg = resp.json()["error"]["message"]
            assert "worker rank 1 failed" in msg
            assert "Traceback" not in msg and "/home/" not in msg and "\n" not in msg, msg
        logged = "\n".join(rec.getMessage() + str(rec.exc_info[1] if rec.exc_info else "")
                           for rec in caplog.records)
        assert "/home/someone/twinserve/backends/real/worker.py" in logged
    finally:
        s.stop()


def test_vllm_serve_flags_are_accepted() -> None:
    from twinserve.backends.real.serving.launch import note_ignored_flags
    from twinserve.cli import build_parser

    ns = build_parser().parse_args(["serve", "tiny", "--disable-log-requests", "--trust-remote-code",
                                    "--generation-config", "auto", "--chat-template", "{{ messages }}",
                                    "--max-logprobs", "30"])
    assert ns.max_logprobs == 30 and ns.chat_template == "{{ messages }}"
    assert len(note_ignored_flags(ns)) == 3


def test_chat_template_flag_reads_a_file_or_inline_jinja(tmp_path: Path) -> None:
    from twinserve.backends.real.serving.launch import load_chat_template

    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_template(str(f)) == f.read_text()
    assert load_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    assert load_chat_template(None) is None
    with pytest.raises(InvalidConfigError, match="chat_template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(InvalidConfigError, match="valid Jinja"):
        load_chat_template("{% for m in messages %}")


def test_vllm_prefix_carries_the_older_and_request_levelprometheus_series(tiny_model_dir: Path) -> None:
    s = start_server(tiny_model_dir, engine_core_mode="inproc", config_kw={"metrics_prefix": "vllm"})
    try:
        r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": "the quick brown", "n": 2,
                                                        "max_tokens": 5, "ignore_eos": True}, timeout=60)
        assert r.status_code == 200
        httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": ""}, timeout=60)  # a 400
        text = httpx.get(s.url + "/metrics", timeout=10).text
        series = prometheus_series(text)
        assert "vllm:gpu_cache_usage_perc" in series
        assert series["vllm:time_per_output_token_seconds_count"] == series["vllm:inter_token_latency_seconds_count"]
        assert series["vllm:time_per_output_token_seconds_count"] > 0
        assert series["vllm:iteration_tokens_total_count"] >= 5
        assert series["vllm:iteration_tokens_total_sum"] >= 10  # every generated token was scheduled
        assert series["vllm:request_params_n_sum"] == 2 and series["vllm:request_params_max_tokens_sum"] == 5
        assert re.search(r'http_requests_total\{handler="/v1/completions",method="POST",status="2xx"\} 1\.0',
                         text), text
        assert re.search(r'http_requests_total\{handler="/v1/completions",method="POST",status="4xx"\} 1\.0',
                         text)
    finally:
        s.stop()
