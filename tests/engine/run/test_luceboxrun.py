"""Reading the Lucebox engine: its --help, log lines, reply usage and status page, as recorded
from the pinned engine on the H100 (tests/engine/fixtures/lucebox/)."""

from __future__ import annotations

import json
from pathlib import Path

from lucebox.engine.engines.luceboxbuild import capabilities_of, parse_help
from lucebox.engine.run.death import DeathFacts, name_death
from lucebox.engine.run.kinds.luceboxrun import (
    LuceboxLog,
    parse_decode,
    parse_pool,
    parse_reply,
    parse_target_loaded,
    reply_from_usage,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lucebox"


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_capabilities_from_the_recorded_help():
    help_text = (FIXTURES / "help.txt").read_text()
    flags, kv_types = parse_help(help_text)
    assert {"--draft", "--ddtree", "--ddtree-budget", "--max-ctx", "--max-tokens"} <= set(flags)
    assert kv_types == ("f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "tq3_0")
    caps = capabilities_of(help_text, b"... --kvflash ... DFLASH_SAMPLED_VERIFY", None,
                           symmetric_only=True)  # fmt: skip
    assert caps.spec_types == ("dflash", "ddtree")
    assert caps.kv_cache_types == ("f16", "bf16", "q4_0", "q8_0", "tq3_0")
    assert caps.features == (
        "draft-device", "prefill-compression", "kvflash", "sampled-verify", "symmetric-kv-only",
    )  # fmt: skip
    newer = capabilities_of((FIXTURES / "help-4cf58a04.txt").read_text(), b"", None,
                            symmetric_only=True)  # fmt: skip
    assert newer.features[:3] == ("draft-device", "target-split-mode", "prefill-compression")


def test_decode_lines():
    ar = parse_decode("[ar-decode] tokens=256 time=0.328 s speed=781.30 tok/s")
    assert ar is not None and not ar.speculative
    assert (ar.tokens, ar.time_s, ar.tokens_per_s) == (256, 0.328, 781.30)
    recorded = [d for d in map(parse_decode, lines("ddtree-spec.log")) if d and d.speculative]
    assert [(d.tokens, d.steps, d.accepted, d.drafted) for d in recorded] == [
        (8, 4, 0, 64), (192, 96, 0, 1536), (192, 96, 0, 1536), (16, 8, 0, 128),
    ]  # fmt: skip
    assert recorded[1].avg_commit == 2.0 and recorded[1].tokens_per_s == 253.15
    assert parse_decode("[server] listening on http://127.0.0.1:18180") is None


def test_every_recorded_reply_line_parses():
    replies = [r for r in map(parse_reply, lines("plain.log")) if r is not None]
    assert [r.completion_tokens for r in replies] == [8, 256, 512, 16]
    assert all(r.ok and r.error is None for r in replies)
    assert replies[1].decode_tokens_per_s == 781.2 and replies[1].finish == "stop"
    failed = [r for r in map(parse_reply, lines("ddtree.log")) if r is not None]
    assert failed[0].ok is False and failed[0].error == "decode_failed"


def test_the_log_gives_each_reply_with_its_decode_time():
    log = LuceboxLog()
    for line in lines("plain.log"):
        log.feed(line)
    finished = log.take_finished()
    assert [r.generated_tokens for r in finished] == [8, 256, 512, 16]
    assert finished[1].decode_s == 0.328  # the [ar-decode] line's, not DONE's 0.1 s steps
    assert finished[1].prompt_tokens == 64
    assert log.replies_without_speculation == 4
    assert log.take_finished() == []


def test_speculation_totals_and_replies_served_without_it():
    """DDTree run on the H100 with a random-weight draft: greedy replies speculate (nothing
    accepted); the one with a temperature decoded without speculation."""
    log = LuceboxLog()
    for line in lines("ddtree-spec.log"):
        log.feed(line)
    assert (log.accepted_total, log.drafted_total, log.spec_steps_total) == (0, 3264, 204)
    assert log.replies_without_speculation == 1
    finished = log.take_finished()
    assert [(r.generated_tokens, r.draft_generated) for r in finished] == [
        (8, 64), (192, 1536), (256, 0), (192, 1536), (16, 128),
    ]  # fmt: skip
    assert [r.served().speculated for r in finished] == [True, True, False, True, True]


def test_a_draft_that_stops_midway_fails_the_reply():
    log = LuceboxLog()
    for line in lines("chain.log"):
        log.feed(line)
    assert log.failed_replies == ["chatcmpl_0000000000000001: decode_failed"]
    assert [r.generated_tokens for r in log.take_finished()] == [8, 16]


def test_a_failed_draft_step_is_a_speculation_failure():
    log = LuceboxLog()
    for line in lines("ddtree.log"):
        log.feed(line)
    assert log.spec_failure == "draft-kv step prep failed"
    assert log.failed_replies[0].endswith("decode_failed")


def test_kvflash_and_load_lines():
    assert [p for p in map(parse_pool, lines("kvflash.log")) if p] == [(1024, 4096)]
    assert [p for p in map(parse_pool, lines("kvflash-auto.log")) if p] == [(16384, 65536)]
    loaded = [t for t in map(parse_target_loaded, lines("plain.log")) if t]
    assert loaded == [(int(0.64 * 2**30), 485 * 2**20)]


def test_reply_usage_and_the_streamed_usage_chunk():
    usage = json.loads((FIXTURES / "plain.reply.json").read_text())["usage"]
    prompt, completion, prefill_s, decode_s, accept = reply_from_usage(usage)
    assert (prompt, completion) == (64, 256)
    assert prefill_s > 0 and decode_s > 0 and accept == 0.0
    chunks = [
        json.loads(line[6:]) for line in lines("plain.stream.txt") if line.startswith("data: {")
    ]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16


def test_status_page_history():
    status = json.loads((FIXTURES / "plain.status.json").read_text())
    history = status["perf_history"]
    assert status["total_requests"] == len(history) == 4
    assert {"decode_tok_s", "prefill_tok_s", "spec_decode", "accept_rate"} <= set(history[0])


def test_load_failures_and_aborts_are_named():
    assert name_death(1, lines("mtp-target.log"), DeathFacts()).code == "model-load"
    oom = "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1234.00 MiB on device 0: "
    # The engine aborts (SIGABRT) after a failed allocation: its line names the death.
    aborted = name_death(-6, [oom + "cudaMalloc failed: out of memory"], DeathFacts())
    assert aborted.code == "gpu-out-of-memory" and aborted.returncode == -6
    refused = name_death(1, ["[server] unknown option: --max-ctx=4096"], DeathFacts())
    assert refused.code == "bad-flag" and not refused.retry
