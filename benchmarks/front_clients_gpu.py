"""Clients of lucebox's front over a running `lucebox serve`, run on the GPU by
`bash benchmarks/device/drive.sh front_clients_gpu`.

    python3 -m benchmarks.front_clients_gpu clients FRONT_URL ENGINE_URL MODEL KEY
        the official openai and anthropic SDKs (chat streaming, Responses, Messages), 16
        streamed clients at once (answered, in arrival order, the longest silence of each),
        and the front's overhead (benchmarks/front_overhead.py); one JSON document on stdout.
    python3 -m benchmarks.front_clients_gpu lan URL KEY
        a LAN-style address: refused without the key, served with it; JSON on stdout.

Each check records its error instead of stopping the others: the device run gets one try.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import httpx

from benchmarks.front_overhead import compare

CLIENTS = 16
STAGGER_S = 0.05
MAX_TOKENS = 48
SILENCE_LIMIT_S = 15.0


def checked(name: str, check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    started_s = time.monotonic()
    try:
        result = {"ok": True, **check()}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]}
        traceback.print_exc(file=sys.stderr)
    result["seconds"] = round(time.monotonic() - started_s, 2)
    print(f"{name}: {'ok' if result['ok'] else result['error']}", file=sys.stderr)
    return result


def sdk_checks(front: str, model: str, key: str) -> dict[str, Any]:
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=f"{front}/v1", api_key=key, timeout=120)
    ant = anthropic.Anthropic(base_url=front, api_key=key, timeout=120)
    ask: Any = [{"role": "user", "content": "Say hello."}]

    def chat_stream() -> dict[str, Any]:
        stream: Any = oai.chat.completions.create(
            model=model, messages=ask, max_tokens=16, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        return {"text": text[:200]}

    def responses() -> dict[str, Any]:
        reply = oai.responses.create(model=model, input="Say hello.", max_output_tokens=16)
        return {"text": reply.output_text[:200], "id": reply.id}

    def responses_stream() -> dict[str, Any]:
        kinds = [e.type for e in oai.responses.create(
            model=model, input="Say hello.", max_output_tokens=16, stream=True
        )]  # fmt: skip
        return {"event_types": sorted(set(kinds))}

    def messages() -> dict[str, Any]:
        reply = ant.messages.create(model=model, max_tokens=16, messages=ask)
        return {"id": reply.id, "text": str(reply.content)[:200]}

    def messages_stream() -> dict[str, Any]:
        with ant.messages.stream(model=model, max_tokens=16, messages=ask) as stream:
            text = "".join(stream.text_stream)
        return {"text": text[:200]}

    return {
        "versions": {"openai": openai.__version__, "anthropic": anthropic.__version__},
        "openai_chat_stream": checked("openai chat stream", chat_stream),
        "openai_responses": checked("openai responses", responses),
        "openai_responses_stream": checked("openai responses stream", responses_stream),
        "anthropic_messages": checked("anthropic messages", messages),
        "anthropic_messages_stream": checked("anthropic messages stream", messages_stream),
    }


def one_client(front: str, model: str, key: str, index: int, seen: dict[int, Any]) -> None:
    """A streamed chat; every line's arrival time kept (comments count as signs of life)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Client {index}: tell a story."}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    sent_s = time.monotonic()
    lines: list[tuple[float, str]] = []
    try:
        with httpx.stream(
            "POST",
            f"{front}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(30.0, read=SILENCE_LIMIT_S * 4),
        ) as reply:
            status = reply.status_code
            for line in reply.iter_lines():
                if line:
                    lines.append((time.monotonic(), line))
    except httpx.HTTPError as exc:
        seen[index] = {"sent_s": sent_s, "error": str(exc)}
        return
    stamps = [sent_s, *(at for at, _ in lines)]
    data = [at for at, line in lines if line.startswith("data:") and "[DONE]" not in line]
    seen[index] = {
        "sent_s": sent_s,
        "status": status,
        "first_data_s": round(data[0] - sent_s, 3) if data else None,
        "first_data_at": data[0] if data else None,
        "done": bool(lines) and lines[-1][1] == "data: [DONE]",
        "data_lines": len(data),
        "queued_notes": sum(1 for _, line in lines if line.startswith(": queued")),
        "keepalives": sum(1 for _, line in lines if line.startswith(": keep-alive")),
        "max_gap_s": round(max(b - a for a, b in itertools.pairwise(stamps)), 3),
        "wall_s": round(stamps[-1] - sent_s, 3),
    }


def many_clients(front: str, model: str, key: str) -> dict[str, Any]:
    seen: dict[int, Any] = {}
    threads = []
    for index in range(CLIENTS):
        thread = threading.Thread(target=one_client, args=(front, model, key, index, seen))
        thread.start()
        threads.append(thread)
        time.sleep(STAGGER_S)
    for thread in threads:
        thread.join(SILENCE_LIMIT_S * 8)
    clients = [seen.get(i, {"error": "no answer"}) for i in range(CLIENTS)]
    answered = [c for c in clients if c.get("done")]
    by_first = sorted(
        (i for i, c in enumerate(clients) if c.get("first_data_at") is not None),
        key=lambda i: clients[i]["first_data_at"],
    )
    gaps = [c["max_gap_s"] for c in clients if c.get("max_gap_s") is not None]
    for client in clients:
        client.pop("first_data_at", None)
        client.pop("sent_s", None)
    return {
        "clients": clients,
        "all_answered": len(answered) == CLIENTS,
        "in_order": by_first == list(range(CLIENTS)),
        "order_of_first_token": by_first,
        "max_silence_s": max(gaps) if gaps else None,
        "none_silent_over_limit": bool(gaps) and max(gaps) <= SILENCE_LIMIT_S,
    }


def clients_run(front: str, engine: str, model: str, key: str) -> dict[str, Any]:
    return {
        "sdk": checked("sdk", lambda: sdk_checks(front, model, key)),
        "many_clients": checked("16 clients", lambda: many_clients(front, model, key)),
        "overhead": checked("overhead", lambda: compare(engine, front, 8, 128, key)),
        "metrics": checked(
            "metrics",
            lambda: {
                "text": httpx.get(
                    f"{front}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30
                ).text[-3000:]
            },
        ),
    }


def lan_run(url: str, key: str) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}

    def refused() -> dict[str, Any]:
        plain = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        wrong = httpx.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"Authorization": "Bearer wrong"},
            timeout=60,
        )
        return {"without_key": plain.status_code, "wrong_key": wrong.status_code}

    def served() -> dict[str, Any]:
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        return {"status": reply.status_code, "body": reply.text[:300]}

    result: dict[str, Any] = {
        "url": url,
        "refused": checked("lan refused", refused),
        "served": checked("lan served", served),
    }
    result["ok"] = (
        result["refused"].get("without_key") == 401
        and result["refused"].get("wrong_key") == 401
        and result["served"].get("status") == 200
    )
    return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["clients"] and len(argv) == 5:
        print(json.dumps(clients_run(argv[1], argv[2], argv[3], argv[4])))
        return 0
    if argv[:1] == ["lan"] and len(argv) == 3:
        print(json.dumps(lan_run(argv[1], argv[2])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
