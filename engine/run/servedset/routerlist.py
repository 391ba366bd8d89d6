"""The router's model list as every reader in lucebox takes it: a 200 list, or unknown.

The router's list handler always answers 200 with a ``data`` list (``get_router_models``,
tools/server/server-models.cpp of the pinned source). Anything else says nothing of the
models: its HTTP layer answers ``503 {"error": {"message": "Loading model"}}`` to every request
until it is ready (``middleware_server_state``, server-http.cpp), a throwing handler gives 500,
and a router down or restarting answers nothing. Read as an empty list, such an answer would
let the proxy's gate admit a model past the memory budget and a stop's saves save nothing, so
the list is asked again for a short while and is otherwise unknown (:class:`ModelListError`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from lucebox.engine.core.errors import RunError

LIST_WAIT_S = 2.0
"""How long a reader asks again while the router answers no list (starting, restarting):
clients poll the list and a request waits on the gate, so neither may hang on it."""
LIST_POLL_S = 0.1


class ModelListError(RunError):
    """The router answered no model list within the wait; the message says its last answer."""


def error_message(answer: httpx.Response) -> str:
    """What an error answer of the router (or the proxy) says, else its status line."""
    try:
        message = answer.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = None
    return str(message) if message else f"HTTP {answer.status_code} {answer.reason_phrase}"


async def router_list(
    client: httpx.AsyncClient, wait_s: float = LIST_WAIT_S, poll_s: float = LIST_POLL_S
) -> dict[str, Any]:
    """The router's ``GET /models`` list (``client`` has its base URL), asked again every
    ``poll_s`` for up to ``wait_s`` while it answers none.

    Raises:
        ModelListError: no list came within ``wait_s``; it says the router's last answer.
    """
    why = f"the router answered nothing within {wait_s:g} s"
    try:
        async with asyncio.timeout(wait_s):
            while True:
                try:
                    answer = await client.get("/models")
                    listed = answer.json() if answer.status_code == 200 else None
                    if isinstance(listed, dict) and isinstance(listed.get("data"), list):
                        return listed
                    why = f"the router answered {answer.status_code} ({error_message(answer)})"
                except httpx.HTTPError as exc:
                    why = f"the router did not answer ({type(exc).__name__}: {exc})"
                except ValueError:
                    why = "the router's list was not JSON"
                await asyncio.sleep(poll_s)
    except TimeoutError:
        pass
    raise ModelListError(why)
