"""`lucebox bench` input checks that need no server: each a one-line message and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from lucebox.engine.bench.compare import parse_compare
from lucebox.engine.core.errors import UsageError
from tests.conftest import assert_one_line_error, run_lucebox

SESSION = Path(__file__).resolve().parents[3] / "assets" / "agent-session.jsonl"


@pytest.mark.parametrize(
    "args, says",
    [
        (["replay", str(SESSION)], "no lucebox server is ready"),
        (["quick"], "no lucebox server is ready"),
        (["replay", "/nonexistent/session.jsonl"], "no such transcript"),
        (["replay", str(SESSION), "--url", "http://x", "--compare", "cache=on,off"], "exclude"),
        (["replay", str(SESSION), "--compare", "spec=on,off"], "--compare cache=on,off"),
        (["quick", "--compare", "spec=on"], "two different values"),
        (["quick", "--model", "x.gguf"], "choose what --compare serves"),
        (["replay", str(SESSION), "--between", "restart"], "--between needs --model"),
        (["replay", str(SESSION), "--between", "restart", "--url", "http://x"], "neither"),
        (["replay", str(SESSION), "--between", "swap:", "--model", "x.gguf"], "not an event"),
    ],
)
def test_bad_bench_input_is_one_line_and_exit_2(args, says):
    result = run_lucebox("bench", *args)
    assert result.returncode == 2, result.stderr
    assert_one_line_error(result)
    assert says in result.stderr


def test_a_transcript_without_calls_is_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"type": "summary", "summary": "x"}\nnot json\n')
    result = run_lucebox("bench", "replay", str(empty))
    assert result.returncode == 2
    assert "warning: empty.jsonl: line 2: not valid JSON" in result.stderr
    assert_one_line_error(result)
    assert "no assistant turns" in result.stderr


def test_compare_values_map_to_configurations():
    on, off = parse_compare("cache=on,off", ("cache",))
    assert (on.name, on.serve_args, on.request_fields) == ("cache=on", ("--cache", "agent"), ())
    assert off.serve_args == ("--cache", "off")
    assert off.request_fields == (("cache_prompt", False),)
    spec_off, spec_on = parse_compare("spec=off,on", ("spec", "engine"))
    assert spec_on.serve_args == ("--spec", "auto")
    assert (spec_off.name, spec_off.serve_args) == ("spec=off", ("--spec", "off"))
    with pytest.raises(UsageError):
        parse_compare("cache=on,on", ("cache",))
    lucebox, llama = parse_compare("engine=lucebox,llama-server", ("spec", "engine"))
    assert (lucebox.name, lucebox.engine, lucebox.serve_args) == ("engine=lucebox", "lucebox", ())
    assert (llama.name, llama.engine) == ("engine=llama-server", "llama-server")
    with pytest.raises(UsageError, match="engine=lucebox,llama-server"):
        parse_compare("engine=on,off", ("spec", "engine"))


def test_comparing_engines_without_an_nvidia_gpu_is_refused_before_any_server_starts():
    """This PC has no NVIDIA GPU: the Lucebox side is planned first and refused (exit 3),
    saying why and what to do; nothing was started."""
    result = run_lucebox(
        "bench", "quick", "--compare", "engine=lucebox,llama-server",
        "--preset", "qwen3.6-27b-lucebox",
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert_one_line_error(result)
    assert "cannot compare engines: engine=lucebox would not start" in result.stderr
    assert "runs only on NVIDIA GPUs" in result.stderr
    assert "lucebox plan --engine lucebox" in result.stderr
    assert "starting lucebox serve" not in result.stderr
