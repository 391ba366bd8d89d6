"""lucebox found on the home network: DNS-SD over mDNS while it serves beyond loopback.

A phone or a second PC finds ``NAME.local`` instead of being told an address: the chat page
as ``_http._tcp`` (what browsers' and phones' service lists show) and the API as
``_lucebox._tcp``, whose TXT record says the API path, the model, the engine and whether a key
is needed (never the key). python-zeroconf answers the queries on the LAN addresses the
server listens on; loopback is never announced. :func:`find` is the other side, for
`lucebox find`.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from zeroconf import ServiceInfo, Zeroconf

API_SERVICE = "_lucebox._tcp.local."
PAGE_SERVICE = "_http._tcp.local."
FIND_S = 3.0
"""How long `lucebox find` listens for answers: mDNS responders answer within a second."""


@dataclass(frozen=True)
class Announced:
    """What lucebox says of itself on the LAN."""

    name: str
    """The instance and host name (``lucebox`` is ``lucebox.local``)."""
    addresses: tuple[str, ...]
    port: int
    model: str
    engine: str
    key_needed: bool

    def properties(self) -> dict[str, str]:
        return {
            "path": "/v1",
            "model": self.model,
            "engine": self.engine,
            "key": "required" if self.key_needed else "none",
        }


def lan_addresses(host: str) -> tuple[str, ...]:
    """The IPv4 addresses a server bound to ``host`` answers on, loopback and link-local left
    out: every interface's for a wildcard bind, else ``host`` itself."""
    if host not in ("0.0.0.0", "::", ""):
        candidates = [host]
    else:
        candidates = [
            a.address
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family == socket.AF_INET
        ]
    found = []
    for text in candidates:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        if address.version == 4 and not (address.is_loopback or address.is_link_local):
            found.append(text)
    return tuple(dict.fromkeys(found))


def _infos(what: Announced) -> list[ServiceInfo]:
    from zeroconf import ServiceInfo

    packed = [socket.inet_aton(a) for a in what.addresses]
    server = f"{what.name}.local."
    return [
        ServiceInfo(
            API_SERVICE,
            f"{what.name}.{API_SERVICE}",
            addresses=packed,
            port=what.port,
            properties=what.properties(),
            server=server,
        ),
        ServiceInfo(
            PAGE_SERVICE,
            f"{what.name}.{PAGE_SERVICE}",
            addresses=packed,
            port=what.port,
            properties={"path": "/"},
            server=server,
        ),
    ]


class Announcer:
    """The records answered on the LAN addresses from :meth:`start` to :meth:`close`.

    python-zeroconf's blocking calls run its own loop on a thread of its own: call these from a
    thread, never from an asyncio loop (the run uses ``asyncio.to_thread``)."""

    def __init__(self, what: Announced) -> None:
        self.what = what
        self._zc: Zeroconf | None = None
        self._infos: list[ServiceInfo] = []

    def start(self) -> str | None:
        """The name announced: one another host holds gets a number (``lucebox (2)``), as
        DNS-SD asks; None when there is nothing to announce on."""
        if not self.what.addresses or not self.what.name:
            return None
        from zeroconf import IPVersion, Zeroconf

        self._zc = Zeroconf(interfaces=list(self.what.addresses), ip_version=IPVersion.V4Only)
        self._infos = _infos(self.what)
        for info in self._infos:
            self._zc.register_service(info, allow_name_change=True)
        return self._infos[0].name.removesuffix(f".{API_SERVICE}")

    def close(self) -> None:
        if self._zc is None:
            return
        for info in self._infos:
            self._zc.unregister_service(info)
        self._zc.close()
        self._zc = None


@contextmanager
def announcing(what: Announced) -> Iterator[str | None]:
    """:class:`Announcer` for a block of blocking code."""
    announcer = Announcer(what)
    try:
        yield announcer.start()
    finally:
        announcer.close()


@dataclass(frozen=True)
class Found:
    name: str
    address: str
    port: int
    model: str
    engine: str
    key_needed: bool

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


def find(interfaces: tuple[str, ...] = (), wait_s: float = FIND_S) -> list[Found]:
    """The lucebox servers answering on the LAN (on ``interfaces``, default all)."""
    from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceListener, Zeroconf

    names: list[str] = []

    class Listener(ServiceListener):
        def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            names.append(name)

        def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            pass

        def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            pass

    chosen = list(interfaces) if interfaces else InterfaceChoice.All
    zc = Zeroconf(interfaces=chosen, ip_version=IPVersion.V4Only)
    try:
        browser = ServiceBrowser(zc, API_SERVICE, Listener())
        time.sleep(wait_s)
        browser.cancel()
        found = []
        for name in dict.fromkeys(names):
            info = zc.get_service_info(API_SERVICE, name, timeout=int(wait_s * 1000))
            if info is None or not info.parsed_addresses():
                continue
            props = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
            found.append(
                Found(
                    name.removesuffix(f".{API_SERVICE}"),
                    info.parsed_addresses()[0],
                    info.port or 0,
                    props.get("model", ""),
                    props.get("engine", ""),
                    props.get("key") == "required",
                )
            )
        return found
    finally:
        zc.close()
