"""Who may use the front (pure): the API key, and ``Host``/``Origin`` against DNS rebinding.

A web page in the user's browser can reach a server on loopback through a name it controls
that resolves to 127.0.0.1 (DNS rebinding): the browser then sends that name as ``Host`` and
the page's origin as ``Origin``. The front answers only ``Host`` values that are addresses,
loopback names, the configured host or this machine's own names, and only the ``Origin`` of its
own pages (the engine's web UI is served through the front, so it is same-origin) and the
origins the user allowed (``server.allowed_origins``: a chat app served elsewhere on the LAN;
``*`` only when written out); CORS headers go to that origin alone. The key, when set, is
compared in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from lucebox.engine.core.address import is_loopback
from lucebox.engine.machine.personkeys import SCOPES, KeyRing, KeyWatch, Scope

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
"""Answered without the key, as llama-server does (a supervisor's or a load balancer's probe)."""
PAGE_PATHS = frozenset({"/", "/index.html"})
"""The web UI's page: a browser loads it without a key and the page then sends the key."""
PAGE_ASSET_SUFFIXES = (".js", ".css", ".svg", ".ico", ".png", ".webmanifest", ".woff2", ".json")
"""The page's files (llama-server's bundle under ``/_app/``, its icons): public as the page is,
as llama-server has them; no API path ends so, and a made-up one finds nothing."""
ANY_HOST = ("0.0.0.0", "::", "")
GENERATION_SUFFIXES = (
    "/chat/completions",
    "/completions",
    "/completion",
    "/messages",
    "/responses",
    "/infill",
    "/embeddings",
    "/embedding",
    "/rerank",
    "/reranking",
)
"""POST paths that occupy the engine (and so wait their turn in the queue)."""
CHAT_POST_SUFFIXES = (
    *GENERATION_SUFFIXES,
    "/count_tokens",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/streams/lookup",
)
"""What a chat-scoped key may POST: replies, and the counting a client does around them."""
CHAT_GET_PATHS = frozenset(
    {"/v1/models", "/models", "/api/tags", "/api/version", "/props", "/tools"}
)
"""What a chat-scoped key may GET: the models, and what the chat page reads at start."""
MODELS_PATHS = frozenset({"/models/load", "/models/unload", "/props"})
"""A served set's models loaded and unloaded, and the server's properties read."""
SERVER_KEY_NAME = "server.api_key"


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str


@dataclass(frozen=True)
class FrontPolicy:
    """What the front allows."""

    host: str
    """The address the front binds (the user's ``--host``)."""
    port: int
    api_key: str | None = None
    machine_names: tuple[str, ...] = ()
    """This machine's own names (hostname, hostname.local): LAN clients may use them."""
    allowed_origins: tuple[str, ...] = ()
    """Other web origins whose pages may call the API (config's normalized form, or ``*``)."""
    people: Callable[[], KeyRing] = KeyRing
    """Each person's key as the keys file holds it now (read again when it changes)."""

    def host_allowed(self, host_header: str) -> bool:
        name = host_name(host_header)
        if not name:
            return False
        if is_address(name) or is_loopback_name(name):
            return True
        return name in {self.host.lower(), *(n.lower() for n in self.machine_names)}

    def origin_allowed(self, origin: str) -> bool:
        """An origin the user allowed, or one of the front's own pages: its scheme is http,
        its host allowed and its port the front's."""
        if "*" in self.allowed_origins or origin.lower().rstrip("/") in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        if parts.scheme != "http" or parts.hostname is None:
            return False
        try:
            port = parts.port or 80
        except ValueError:
            return False
        return port == self.port and self.host_allowed(parts.netloc)

    def caller(self, headers: dict[str, str]) -> Caller | None:
        """Whose key the request carries (None: a key is wanted and this is none of them);
        with no key set anywhere, anyone may call with every scope."""
        ring = self.people()
        if not self.api_key and not ring.keys:
            return Caller(None, "admin")
        given = presented_key(headers)
        if given is None:
            return None
        if self.api_key and hmac.compare_digest(given.encode(), self.api_key.encode()):
            return Caller(SERVER_KEY_NAME, "admin")
        person = ring.who(given)
        return Caller(person.name, person.scope) if person else None


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the name of its key (None: no key needed) and its scope."""

    key_name: str | None
    scope: Scope


def is_generation(method: str, path: str) -> bool:
    """Whether the request occupies the engine (it waits its turn in the queue)."""
    return method == "POST" and path.endswith(GENERATION_SUFFIXES)


def scope_needed(method: str, path: str) -> Scope:
    if method == "POST" and path.endswith(CHAT_POST_SUFFIXES):
        return "chat"
    if method in ("GET", "HEAD") and (path in CHAT_GET_PATHS or path.startswith("/v1/models/")):
        return "chat"
    return "models" if path in MODELS_PATHS else "admin"


def server_policy(
    host: str, port: int, api_key: str | None, keys_file: Path, allowed_origins: tuple[str, ...]
) -> FrontPolicy:
    """The policy of a server lucebox runs: this machine's names, each person's key as the
    keys file says at each request, the origins the user allowed."""
    watch = KeyWatch(keys_file)
    return FrontPolicy(host, port, api_key, machine_names(), allowed_origins, watch.ring)


def machine_names() -> tuple[str, ...]:
    """This machine's names as LAN clients write them: its hostname, short and ``.local``."""
    full = socket.gethostname().lower()
    short = full.split(".")[0]
    return tuple(dict.fromkeys((full, short, f"{short}.local")))


def host_name(host_header: str) -> str:
    """The name of a ``Host`` value without its port (brackets of an IPv6 literal removed)."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else ""
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback_name(name: str) -> bool:
    return is_loopback(name) or name == "localhost" or name.endswith(".localhost")


def presented_key(headers: dict[str, str]) -> str | None:
    """The key a request carries: ``Authorization: Bearer K``, else ``x-api-key: K``."""
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.strip().partition(" ")
        return value.strip() if scheme.lower() == "bearer" else auth.strip()
    return headers.get("x-api-key")


def header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Headers by lower-case name (a repeated header keeps its first value)."""
    found: dict[str, str] = {}
    for name, value in raw:
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


def admit(policy: FrontPolicy, method: str, path: str, headers: dict[str, str]) -> Refusal | Caller:
    """Why the front refuses this request, or who it comes from when it goes on."""
    host = headers.get("host")
    if host is None or not policy.host_allowed(host):
        return Refusal(421, f"the Host '{host or ''}' is not an address of this server")
    origin = headers.get("origin")
    if origin is not None and not policy.origin_allowed(origin):
        return Refusal(403, f"requests from the web origin '{origin}' are not allowed")
    if method == "OPTIONS" or path in PUBLIC_PATHS:
        return Caller(None, "chat")
    if method in ("GET", "HEAD") and is_page_file(path):
        return Caller(None, "chat")
    caller = policy.caller(headers)
    if caller is None:
        return Refusal(401, "Invalid API Key: send it as 'Authorization: Bearer KEY' or x-api-key")
    needed = scope_needed(method, path)
    if SCOPES.index(caller.scope) < SCOPES.index(needed):
        return Refusal(
            403,
            f"the key '{caller.key_name}' has the {caller.scope} scope; {method} {path} needs "
            f"{needed} (`lucebox keys add NAME --scope {needed}`)",
        )
    return caller


def refusal(policy: FrontPolicy, method: str, path: str, headers: dict[str, str]) -> Refusal | None:
    """Why the front refuses this request, or None when it goes on."""
    answer = admit(policy, method, path, headers)
    return answer if isinstance(answer, Refusal) else None


def is_page_file(path: str) -> bool:
    """Whether ``path`` is the web UI's page or one of its files, loaded without the key."""
    if path in PAGE_PATHS:
        return True
    return not path.startswith("/v1/") and path.endswith(PAGE_ASSET_SUFFIXES)


def cors_headers(origin: str | None) -> list[tuple[str, str]]:
    """CORS headers for an allowed ``origin`` (the front's own pages); none without one."""
    if origin is None:
        return []
    return [
        ("access-control-allow-origin", origin),
        ("access-control-allow-credentials", "true"),
        ("access-control-allow-methods", "GET, POST, OPTIONS"),
        ("access-control-allow-headers", "authorization, content-type, x-api-key"),
        ("vary", "origin"),
    ]
