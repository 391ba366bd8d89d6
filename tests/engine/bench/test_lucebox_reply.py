"""bench's measure of a Lucebox-engine reply: the engine streams (its recorded stream, replayed
by support/luceboxfake.py as the engine binary), its usage chunk gives prefill and decode times,
and what it drafted and accepted comes from its log lines (recorded on the H100)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lucebox.engine.bench.measure import streamed_call, with_lucebox_log
from support import luceboxfake
from support.health import wait_healthy
from support.ports import free_port

FAKE = Path(luceboxfake.__file__)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "lucebox"


@pytest.fixture
def lucebox_engine(tmp_path, monkeypatch):
    """The stand-in engine on a free port, its output in an engine log as the supervisor
    keeps it; yields (url, log)."""
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    port = free_port()
    log = tmp_path / "engine.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(FAKE), "/m/qwen35.gguf", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 10, proc, interval_s=0.05)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_streamed_lucebox_reply_is_measured_from_its_usage_and_log(lucebox_engine):
    url, log = lucebox_engine
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "temperature": 0}
    sample = streamed_call(url, body, {}, engine_log=log)
    # The recorded usage chunk: 40 prompt tokens in 3.9 ms, 16 generated in 21.8 ms.
    assert (sample.prompt_tokens, sample.completion_tokens) == (40, 16)
    assert sample.decode_tok_s == pytest.approx(16 / 0.0218)
    assert sample.prefill_tok_s == pytest.approx(40 / 0.0039)
    assert sample.text.startswith(" t3329") and 0 < sample.ttft_s <= sample.wall_s
    # Its [ar-decode] line: decoded without speculation, so nothing drafted.
    assert sample.draft_tokens == 0 and sample.acceptance is None
    without_log = streamed_call(url, body, {})
    assert without_log.decode_tok_s == sample.decode_tok_s and without_log.draft_tokens is None


def test_drafted_and_accepted_tokens_come_from_the_spec_decode_line():
    """A DDTree reply recorded on the H100 (random-weight draft: nothing accepted)."""
    lines = (FIXTURES / "ddtree-spec.log").read_text().splitlines()
    first_reply = lines[: next(i for i, line in enumerate(lines) if "chat DONE" in line) + 1]
    sample = with_lucebox_log(_empty_sample(), first_reply)
    assert (sample.draft_tokens, sample.accepted_tokens) == (64, 0)
    assert sample.acceptance == 0.0


def _empty_sample():
    from lucebox.engine.bench.measure import CallSample

    return CallSample(0.1, None, None, None, None, 0, None, None, "", 0, 0.1)
