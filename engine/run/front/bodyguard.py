"""What a request body may be before the front passes it on (pure): its size, its nesting, and
the image URLs it names.

A client that is buggy or hostile must get a clear 4xx, never a dropped connection or an engine
asked to fetch what lucebox's own machine holds: a body larger than ``MAX_BODY_BYTES`` is
refused before it is read whole (413), JSON nested past what a parser can follow is refused
(Python's parser gives up near a thousand levels; no API body needs more than a few dozen), and
an image named by a ``file:`` URL or by a link-local or unspecified address (the cloud
metadata address 169.254.169.254 among them) is refused: send images inline as ``data:`` URLs
or from a web server (one on this PC's loopback too).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from lucebox.engine.core.units import MIB
from lucebox.engine.run.front.frontguard import Refusal

MAX_BODY_BYTES = 32 * MIB
"""A 200K-token conversation is about 1 MiB and an inline image a few: 32 MiB holds both with
room, and bounds what one request makes the front hold in memory."""


MAX_MESSAGES = 20_000
"""Messages one request may carry: a long agent session's tool calls and results are a few
thousand; more is a client looping, and each costs the template work."""
MAX_CHOICES = 16
"""Replies one request may ask for (``n``): each is a whole generation."""


def too_large(length: int) -> Refusal:
    return Refusal(
        413,
        f"the request body is {length:,} bytes; lucebox takes at most {MAX_BODY_BYTES:,} "
        "(send large images one per request, or smaller)",
    )


MESSAGES_PATHS = ("/chat/completions", "/messages")
"""The APIs whose body is a conversation: a ``messages`` list."""
IMAGE_PART_TYPES = frozenset({"image_url", "image", "input_image"})
"""An image in a message: chat's, Anthropic's and Responses' part types."""


def body_refusal(body: bytes, path: str = "", *, images: bool = True) -> Refusal | None:
    """Why the front refuses a generation request's body, or None when it goes on (a body
    that is not JSON goes on: the engine answers it as it would). ``images`` False: the model
    is served without a vision projector, so an image is the client's mistake (400), not the
    engine's failure."""
    try:
        doc = json.loads(body)
    except RecursionError:
        return Refusal(400, "the request's JSON nests too deep to read: send plain JSON")
    except (ValueError, UnicodeDecodeError):
        return None
    if path.endswith(MESSAGES_PATHS) and not (
        isinstance(doc, dict) and isinstance(doc.get("messages"), list) and doc["messages"]
    ):
        return Refusal(400, "'messages' is required: a JSON object with a list of messages")
    counted = _over_count(doc)
    if counted is not None:
        return counted
    if not images and _has_image(doc):
        return Refusal(
            400,
            "this model is served without a vision projector, so it takes no images: send "
            "text, or serve a vision model (see `lucebox status`)",
        )
    for url in _image_urls(doc):
        why = _local_url(url)
        if why is not None:
            shown = url if len(url) <= 80 else url[:77] + "..."
            return Refusal(
                400,
                f"the image URL {shown} {why}: lucebox does not fetch local files or "
                "link-local addresses; send the image inline as a data: URL",
            )
    return None


def _over_count(doc: Any) -> Refusal | None:
    """A request past ``MAX_MESSAGES`` messages or ``MAX_CHOICES`` replies, said with the
    limit."""
    if not isinstance(doc, dict):
        return None
    messages = doc.get("messages")
    if isinstance(messages, list) and len(messages) > MAX_MESSAGES:
        return Refusal(
            400,
            f"the request has {len(messages):,} messages; lucebox takes at most "
            f"{MAX_MESSAGES:,} in one request (summarise or drop the oldest)",
        )
    choices = doc.get("n")
    if isinstance(choices, int) and not isinstance(choices, bool) and choices > MAX_CHOICES:
        return Refusal(
            400, f"'n' is {choices:,}; lucebox makes at most {MAX_CHOICES} replies a request"
        )
    return None


def _objects(doc: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``doc``, however deep (iteratively: the depth is the client's)."""
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            yield item
            stack.extend(v for v in item.values() if isinstance(v, list | dict))


def _image_urls(doc: Any) -> Iterator[str]:
    """Every image URL the body names, in any of the APIs' shapes (chat ``image_url``,
    Responses ``input_image``, Anthropic ``source.url``)."""
    for item in _objects(doc):
        image = item.get("image_url")
        if isinstance(image, dict):
            image = image.get("url")
        if isinstance(image, str):
            yield image
        source = item.get("source")
        if isinstance(source, dict) and isinstance(source.get("url"), str):
            yield source["url"]


def _has_image(doc: Any) -> bool:
    # A tool's JSON schema writes "type" as a list or an object too: only a name is a part's.
    kinds = (item.get("type") for item in _objects(doc))
    return any(isinstance(kind, str) and kind in IMAGE_PART_TYPES for kind in kinds)


def _local_url(url: str) -> str | None:
    """Why ``url`` names something on this machine or its link; None for data: and web URLs."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme == "data":
        return None
    if scheme not in ("http", "https"):
        return f"is a {scheme or 'local'}: URL"
    host = parts.hostname or ""
    if not host:
        return "names no host"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address.is_link_local or address.is_unspecified:
        return "names a link-local or unspecified address"
    return None
