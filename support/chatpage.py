"""What a browser opening lucebox's chat page does at start, and one chat as the page sends it;
the checks of what it got. The CPU test (tests/engine/run/test_chatpage.py) and the GPU step
(benchmarks/device/drive.sh chat_page_gpu) both run it.

Usage: python -m support.chatpage URL KEY   (prints the checks as JSON; exit 1 when one fails)
"""

from __future__ import annotations

import asyncio
import json
import re
import sys

import httpx

PAGE_CHAT = {
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "return_progress": True,
    "reasoning_format": "auto",
    "max_tokens": -1,
    "timings_per_token": True,
}
"""A chat request in the fields the page sends (its max_tokens -1: no limit set)."""


def assets(index: str) -> list[str]:
    """The page's script and style sheet, as its ``index.html`` names them."""
    return re.findall(r'href="\./(_app/immutable/[^"]+\.(?:js|css))"', index)


async def page_session(url: str, key: str) -> dict[str, httpx.Response]:
    """Each answer the page's start and one chat got, by what was asked."""
    auth = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        seen = {"/": await client.get("/")}
        for asset in assets(seen["/"].text):
            seen[asset] = await client.get(f"/{asset}")
        seen["props without key"] = await client.get("/props")
        for path in ("/props", "/v1/models", "/slots", "/tools"):
            seen[path] = await client.get(path, headers=auth)
        seen["lookup"] = await client.post(
            "/v1/streams/lookup", json={"conversation_ids": ["c1"]}, headers=auth
        )
        seen["chat without key"] = await client.post("/v1/chat/completions", json=PAGE_CHAT)
        seen["chat"] = await client.post("/v1/chat/completions", json=PAGE_CHAT, headers=auth)
    return seen


def _json(reply: httpx.Response) -> object:
    try:
        return reply.json()
    except ValueError:
        return None


def page_checks(seen: dict[str, httpx.Response], ctx: int) -> dict[str, bool]:
    """Whether each thing the page needs came as the page reads it."""
    page = seen["/"]
    names = assets(page.text)
    props = _json(seen["/props"])
    settings = props.get("default_generation_settings", {}) if isinstance(props, dict) else {}
    models = _json(seen["/v1/models"])
    chat = seen["chat"]
    return {
        "page": page.status_code == 200 and "text/html" in page.headers.get("content-type", ""),
        "script_and_style": {n.rsplit(".", 1)[1] for n in names} == {"js", "css"},
        "assets_load": all(
            seen[n].status_code == 200 and len(seen[n].content) > 1000 for n in names
        ),
        "key_asked": seen["props without key"].status_code == 401,
        "chat_refused_without_key": seen["chat without key"].status_code == 401,
        "props": isinstance(props, dict)
        and props.get("role") == "model"
        and settings.get("n_ctx") == ctx,
        "models": isinstance(models, dict) and bool(models.get("data")),
        "slots": seen["/slots"].status_code == 200 and isinstance(_json(seen["/slots"]), list),
        "tools": seen["/tools"].status_code == 200,
        "lookup": _json(seen["lookup"]) == [],
        "chat": chat.status_code == 200
        and "data: [DONE]" in chat.text
        and re.search(r'"content"\s*:\s*"[^"]', chat.text) is not None,
    }


def main(argv: list[str]) -> int:
    url, key, ctx = argv[0], argv[1], int(argv[2])
    seen = asyncio.run(page_session(url, key))
    checks = page_checks(seen, ctx)
    # The key is the run's own: the command names where it went, not what it was.
    command = f"python3 -m support.chatpage {url} KEY {ctx}"
    tail = seen["chat"].text[-400:]
    print(json.dumps({"command": command, "url": url, "checks": checks, "chat_tail": tail}))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
