"""lucebox's front in front of the real llama-server (the suite's CPU build, SmolLM2), and of
the recorded-contract stand-in of the Lucebox engine: the key, Host and Origin, keep-alive to
clients, the queue's order and bound, SSE comments while the engine is silent, and a client's
hang-up stopping the engine's work."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from lucebox.engine.plan.samplingdefaults import FIELDS, SamplingDefaults
from lucebox.engine.run.front.apishape import Shapes
from lucebox.engine.run.front.frontsetup import FrontSetup
from lucebox.engine.run.runstate import Status
from support import luceboxfake
from support.engineserver import RunningServer, running_server
from support.frontserver import RunningFront, loopback_policy, running_front
from support.ports import free_port
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow

KEY = "front-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 160
"""About 1,700 tokens: a prefill of a second or more on two busy CPU cores."""


def chat(content: str, max_tokens: int, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}


@pytest.fixture(scope="module")
def engine(built_engine_home: Path) -> Iterator[RunningServer]:
    from support.realmodels import smol_model

    found = run_lucebox("engine", "path", env={"LUCEBOX_HOME": str(built_engine_home)})
    assert found.returncode == 0, found.stderr
    server_path = Path(found.stdout.strip())
    with running_server(server_path, smol_model(), ["--jinja", "--alias", "smol"]) as server:
        yield server


@pytest.fixture
def front(engine: RunningServer) -> Iterator[RunningFront]:
    spec = FrontSetup(loopback_policy(KEY), "smol", 2048, keepalive_s=0.3, queue_note_s=0.3)
    with running_front(spec, engine.url) as running:
        yield running


def decoded_tokens(engine: RunningServer) -> int | None:
    """Tokens decoded by the busy slot's request; None when no slot is busy."""
    for slot in httpx.get(f"{engine.url}/slots", timeout=10).json():
        if slot["is_processing"]:
            return sum(t.get("n_decoded", 0) for t in slot.get("next_token", []))
    return None


def generating(engine: RunningServer) -> bool:
    """Whether the engine decodes now: a busy slot whose count moves within a second (a
    cancelled request may show its slot busy until the next one, with a count that stays)."""
    before = decoded_tokens(engine)
    time.sleep(1.0)
    after = decoded_tokens(engine)
    return before is not None and after is not None and after != before


def busy_slots(engine: RunningServer) -> int:
    return sum(1 for s in httpx.get(f"{engine.url}/slots", timeout=10).json() if s["is_processing"])


def test_the_key_is_asked_for_everything_but_health_and_the_page(front):
    url = front.url
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert (
        httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    )
    assert httpx.get(f"{url}/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200
    page = httpx.get(f"{url}/")
    assert page.status_code == 200  # llama-server built without its UI answers / with an error
    refused = httpx.post(f"{url}/v1/chat/completions", json=chat("hi", 4))
    assert refused.status_code == 401 and "API Key" in refused.json()["error"]["message"]


def test_without_a_key_every_request_is_served(engine):
    spec = FrontSetup(loopback_policy(), "smol", 2048)
    with running_front(spec, engine.url) as running:
        reply = httpx.post(f"{running.url}/v1/chat/completions", json=chat("hi", 4), timeout=120)
        assert reply.status_code == 200 and reply.json()["choices"]


def test_a_foreign_host_or_origin_is_refused_and_the_own_origin_gets_cors(front):
    url = front.url
    rebound = httpx.get(f"{url}/v1/models", headers={**AUTH, "Host": "attacker.example"})
    assert rebound.status_code == 421
    foreign = httpx.get(f"{url}/v1/models", headers={**AUTH, "Origin": "http://attacker.example"})
    assert foreign.status_code == 403
    own_origin = f"http://localhost:{front.port}"
    own = httpx.get(f"{url}/v1/models", headers={**AUTH, "Origin": own_origin})
    assert own.status_code == 200
    assert own.headers["access-control-allow-origin"] == own_origin
    other_port = httpx.get(
        f"{url}/v1/models", headers={**AUTH, "Origin": f"http://127.0.0.1:{front.port + 1}"}
    )
    assert other_port.status_code == 403
    assert "access-control-allow-origin" not in httpx.get(f"{url}/v1/models", headers=AUTH).headers


def test_one_client_connection_carries_many_requests(front):
    with socket.create_connection(("127.0.0.1", front.port), timeout=30) as sock:
        request = (
            f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{front.port}\r\n"
            f"Authorization: Bearer {KEY}\r\n\r\n"
        ).encode()
        for _ in range(3):
            sock.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)
            assert head.startswith(b"HTTP/1.1 200")
            assert b"connection: close" not in head.lower()
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = b""
            while len(body) < length:
                body += sock.recv(length - len(body))
            assert json.loads(body)["data"][0]["context_length"] == 2048


def test_models_carry_the_context_length_and_metrics_are_lucebox_own(front):
    models = httpx.get(f"{front.url}/v1/models", headers=AUTH).json()
    assert models["object"] == "list"
    (model,) = models["data"]
    assert model["id"] == "smol" and model["context_length"] == 2048 and model["object"] == "model"
    httpx.post(f"{front.url}/v1/chat/completions", json=chat("hi", 4), headers=AUTH, timeout=120)
    text = httpx.get(f"{front.url}/metrics", headers=AUTH).text
    assert "lucebox_queue_depth 0" in text
    assert "lucebox_requests_served_total 1" in text
    assert 'lucebox_responses_total{code="200"}' in text


def stream_lines(url: str, body: dict[str, object], seen: list[tuple[float, str]]) -> None:
    with httpx.stream("POST", url, json=body, headers=AUTH, timeout=300) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line:
                seen.append((time.monotonic(), line))


def test_a_long_prefill_streams_keep_alive_comments_before_the_first_token(front):
    seen: list[tuple[float, str]] = []
    body = chat(LONG_PROMPT, 4, stream=True)
    stream_lines(f"{front.url}/v1/chat/completions", body, seen)
    lines = [line for _, line in seen]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    assert ": keep-alive" in lines[:first_data], lines[:5]
    assert lines[-1] == "data: [DONE]"
    for line in lines:  # every comment is a whole line, never spliced into an event
        assert line.startswith(("data:", ":", "event:")), line  # llama-server pings with ":"
        assert line == ": keep-alive" or "keep-alive" not in line


def test_requests_are_served_in_arrival_order_and_waiting_streams_hear_their_place(front):
    firsts: dict[int, float] = {}
    notes: dict[int, list[str]] = {}

    def client(index: int) -> None:
        seen: list[tuple[float, str]] = []
        # The first reply is long enough that the others must wait behind it.
        tokens = 96 if index == 0 else 8
        body = chat(f"Say {index}.", tokens, stream=True, ignore_eos=index == 0)
        stream_lines(f"{front.url}/v1/chat/completions", body, seen)
        firsts[index] = next(at for at, line in seen if line.startswith("data:"))
        notes[index] = [line for _, line in seen if line.startswith(": queued")]

    threads = []
    for index in range(4):
        thread = threading.Thread(target=client, args=(index,))
        thread.start()
        threads.append(thread)
        time.sleep(0.15)  # a clear arrival order
    for thread in threads:
        thread.join(300)
    assert sorted(firsts, key=firsts.__getitem__) == [0, 1, 2, 3]
    assert notes[3] and notes[3][0].startswith(": queued, position ")
    assert wait_for(lambda: front.front.queue_status().served >= 4, 5)


def test_past_the_bound_a_request_is_told_when_to_retry(engine):
    spec = FrontSetup(loopback_policy(KEY), "smol", 2048, max_waiting=1)
    with running_front(spec, engine.url) as running:
        url = f"{running.url}/v1/chat/completions"
        long = chat("Tell a long story.", 48, ignore_eos=True)
        first = in_background(url, long)
        time.sleep(0.3)
        second = in_background(url, long)
        deadline = time.monotonic() + 30
        while running.front.queue_status().depth < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = httpx.post(url, json=chat("hi", 4), headers=AUTH, timeout=30)
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        status = running.front.queue_status()
        assert status.depth == 1 and status.running == 1 and status.rejected == 1
        assert status.oldest_wait_s is not None
        first.join(300)
        second.join(300)
        # Measured now: the advice follows the served requests' time, not the default.
        assert running.front.queue_status().mean_service_s is not None


def in_background(url: str, body: dict[str, object]) -> threading.Thread:
    """``body`` posted on a thread of its own (started)."""
    options = {"json": body, "headers": AUTH, "timeout": 600}
    thread = threading.Thread(target=httpx.post, args=(url,), kwargs=options)
    thread.start()
    return thread


def wait_for(predicate: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("streamed", [False, True])
def test_a_client_that_hangs_up_stops_its_generation_in_the_engine(front, engine, streamed):
    body = json.dumps(chat("Tell a long story.", 1500, ignore_eos=True, stream=streamed))
    with socket.create_connection(("127.0.0.1", front.port), timeout=30) as sock:
        sock.sendall(
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )
        assert wait_for(lambda: busy_slots(engine) == 1, 30), "the engine never started"
        time.sleep(0.5)
    assert wait_for(lambda: not generating(engine), 15), "the engine kept generating"
    assert wait_for(lambda: front.front.counters.client_gone >= 1, 5)


def test_a_waiting_client_that_hangs_up_leaves_the_queue(front, engine):
    url = f"{front.url}/v1/chat/completions"
    long = chat("Tell a long story.", 48, ignore_eos=True)
    worker = in_background(url, long)
    assert wait_for(lambda: front.front.queue_status().running == 1, 30)
    body = json.dumps(chat("hi", 4))
    with socket.create_connection(("127.0.0.1", front.port), timeout=30) as sock:
        sock.sendall(
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )
        assert wait_for(lambda: front.front.queue_status().depth == 1, 10)
    assert wait_for(lambda: front.front.queue_status().depth == 0, 5)
    assert front.front.queue_status().running == 1  # the first goes on
    worker.join(300)


@contextlib.contextmanager
def fake_engine(tmp_path: Path, **env_extra: str) -> Iterator[str]:
    """The recorded-contract stand-in of ``dflash_server`` on a loopback port."""
    port = free_port()
    env = {**os.environ, "FAKE_REQUESTS": str(tmp_path / "requests.txt"), **env_extra}
    fake = Path(luceboxfake.__file__)
    argv = [sys.executable, str(fake), "model.gguf", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _answers(url), 20)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def lucebox_fake(tmp_path: Path) -> Iterator[str]:
    with fake_engine(tmp_path) as url:
        yield url


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_lucebox_engine_gets_the_same_front(lucebox_fake):
    spec = FrontSetup(loopback_policy(KEY), "qwen", 8192, keepalive_s=0.3)
    with running_front(spec, lucebox_fake) as running:
        url = running.url
        assert httpx.post(f"{url}/v1/chat/completions", json=chat("hi", 16)).status_code == 401
        with httpx.Client(headers=AUTH, timeout=60) as client:
            whole = client.post(f"{url}/v1/chat/completions", json=chat("hi", 16))
            assert whole.status_code == 200 and whole.json()["choices"]
            assert "connection" not in whole.headers  # the engine's close is not passed on
            again = client.post(f"{url}/v1/chat/completions", json=chat("hi", 16))
            assert again.status_code == 200
            lines = []
            with client.stream(
                "POST", f"{url}/v1/chat/completions", json=chat("hi", 16, stream=True)
            ) as reply:
                assert reply.headers["content-type"].startswith("text/event-stream")
                lines = [line for line in reply.iter_lines() if line]
            assert any(line.startswith("data:") for line in lines)
            assert lines[-1] == "data: [DONE]"  # a whole stream the engine closed stays whole
            (model,) = client.get(f"{url}/v1/models").json()["data"]
            assert model["context_length"] == 8192 and model["id"]
            assert client.get(f"{url}/").status_code == 200
            metrics = client.get(f"{url}/metrics").text
            assert "lucebox_requests_served_total 3" in metrics
            assert 'lucebox_responses_total{code="200"} 5' in metrics  # 3 chats, models, index


def test_a_stream_the_lucebox_engine_dies_in_ends_with_an_error_event(tmp_path):
    """The engine ends its streams by closing the connection, so its death in the middle of
    one reads as an end: the stream's missing last event says otherwise (the H200's SIGKILL
    and SIGSTOP faults left clients with a stream that just stopped)."""
    spec = FrontSetup(loopback_policy(KEY), "qwen", 8192, keepalive_s=0.3)
    with (
        fake_engine(tmp_path, FAKE_STREAM_CUT="1") as engine_url,
        running_front(spec, engine_url) as running,
        httpx.Client(headers=AUTH, timeout=60) as client,
    ):
        with client.stream(
            "POST", f"{running.url}/v1/chat/completions", json=chat("hi", 16, stream=True)
        ) as reply:
            lines = [line for line in reply.iter_lines() if line]
        metrics = client.get(f"{running.url}/metrics").text
    # Counted once, by how it ended: the 200 head a cut stream had is not a 200 answer.
    assert 'lucebox_responses_total{code="502"} 1' in metrics
    assert 'lucebox_responses_total{code="200"}' not in metrics
    assert any(line.startswith('data: {"choices"') for line in lines[:-2])
    assert lines[-2] == "event: error"
    error = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert error["code"] == 502
    assert "without its last event" in error["message"]


def test_while_the_engine_restarts_requests_wait_and_a_stopped_run_answers_503(lucebox_fake):
    spec = FrontSetup(loopback_policy(), "qwen", 8192, keepalive_s=0.3)
    with running_front(spec, lucebox_fake) as running:
        running.loop.call_soon_threadsafe(running.front.engine_ready, False)
        reopen = threading.Timer(
            1.5, lambda: running.loop.call_soon_threadsafe(running.front.engine_ready, True)
        )
        reopen.start()
        started_s = time.monotonic()
        with httpx.stream(
            "POST", f"{running.url}/v1/chat/completions", json=chat("hi", 16, stream=True),
            timeout=30,
        ) as reply:  # fmt: skip
            lines = [line for line in reply.iter_lines() if line]
        assert time.monotonic() - started_s >= 1.4  # it waited for the engine
        assert lines[0] == ": keep-alive"  # a stream hears keep-alives while it waits
        assert lines[-1] == "data: [DONE]"
        assert wait_for(lambda: running.front.queue_status().served == 1, 5)
        served_s = running.front.queue_status().mean_service_s
        assert served_s is not None and served_s < 1.0  # the hold counts as waiting
        running.front.status = lambda: Status("stopped")
        running.loop.call_soon_threadsafe(running.front.engine_ready, False)
        time.sleep(0.2)
        refused = httpx.post(f"{running.url}/v1/chat/completions", json=chat("hi", 16))
        assert refused.status_code == 503
        assert "not serving (stopped)" in refused.json()["error"]["message"]


def test_requests_queued_while_the_engine_is_away_wait_from_their_arrival(lucebox_fake):
    """The engine's ready timeout bounds the wait of every request held for it from when it
    went down: the last of three queued behind an engine that does not come back is answered
    when the first is, not after a whole wait of its own once admitted."""
    spec = FrontSetup(loopback_policy(), "qwen", 8192, engine_wait_s=2.0)
    with running_front(spec, lucebox_fake) as running:
        running.loop.call_soon_threadsafe(running.front.engine_ready, False)
        time.sleep(0.2)

        def ask(_: int) -> int:
            url = f"{running.url}/v1/chat/completions"
            return httpx.post(url, json=chat("hi", 16), timeout=30).status_code

        started_s = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            statuses = list(pool.map(ask, range(3)))
        waited_s = time.monotonic() - started_s
    assert statuses == [503, 503, 503]
    assert waited_s < 4.0  # counted from admission, the three waits take 6 s or more


def test_health_waits_while_the_engine_loads_and_hears_once_the_run_has_ended(lucebox_fake):
    spec = FrontSetup(loopback_policy(), "qwen", 8192)
    with running_front(spec, lucebox_fake) as running:
        running.loop.call_soon_threadsafe(running.front.engine_ready, False)
        time.sleep(0.2)
        loading = httpx.get(f"{running.url}/health", timeout=10)
        running.front.status = lambda: Status("stopped")
        ended = httpx.get(f"{running.url}/health", timeout=10)
    assert loading.status_code == 503 and loading.headers["retry-after"] == "1"
    assert loading.json()["error"]["message"] == "Loading model"
    assert ended.status_code == 503 and "retry-after" not in ended.headers
    assert "not serving (stopped)" in ended.json()["error"]["message"]


SAMPLING = SamplingDefaults(0.3, 0.5, 7, 0.1, "preset")
"""Defaults unlike either engine's own, so what each applied shows who filled them in."""


def test_a_client_that_sends_no_sampling_gets_the_same_on_both_engines(engine, tmp_path):
    spec = FrontSetup(loopback_policy(), "smol", 2048)
    llama = Shapes("llama-server", "smol", 2048, None, SAMPLING)
    with running_front(spec, engine.url, llama, SAMPLING) as front:
        # The filled fields are read on every API the front shapes, none refused.
        for path, body in (
            ("/v1/messages", {"model": "smol", **chat("hi", 4)}),
            ("/v1/responses", {"model": "smol", "input": "hi", "max_output_tokens": 4}),
            ("/v1/chat/completions", chat("hi", 4)),
        ):
            reply = httpx.post(f"{front.url}{path}", json=body, timeout=120)
            assert reply.status_code == 200, (path, reply.text)
        mix = front.front.sampling.status()
    assert (mix.greedy, mix.sampled, mix.temperature, mix.source) == (0, 3, 0.3, "clients")
    # llama-server's slot keeps the sampling its last task ran with.
    slots = httpx.get(f"{engine.url}/slots", timeout=10).json()
    params = next(s["params"] for s in slots if isinstance(s.get("params"), dict))
    applied = {k: params[k] for k in FIELDS}
    bodies = tmp_path / "bodies.jsonl"
    lucebox = Shapes("lucebox", "qwen", 8192, False, SAMPLING)
    with (
        fake_engine(tmp_path, FAKE_BODIES=str(bodies)) as url,
        running_front(spec, url, lucebox, SAMPLING) as front,
    ):
        reply = httpx.post(f"{front.url}/v1/chat/completions", json=chat("hi", 4), timeout=60)
        assert reply.status_code == 200
    sent = json.loads(bodies.read_text().splitlines()[-1])
    assert applied == pytest.approx(SAMPLING.fields())
    assert {k: sent[k] for k in FIELDS} == SAMPLING.fields()
