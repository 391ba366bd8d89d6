"""``lucebox share`` and ``lucebox find``: the chat page's LAN address with a QR code for a phone,
and the lucebox servers that answer on the network."""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import asdict
from typing import Any

from lucebox.app.cli.args import add_json, print_json
from lucebox.app.cli.handler import Command
from lucebox.engine.core.errors import EXIT_OK, RunError
from lucebox.engine.core.paths import Paths
from lucebox.engine.run import announce, runstate


def cmd_share(args: argparse.Namespace, paths: Paths) -> int:
    status = runstate.current_status(paths)
    if status.state == "stopped":
        raise RunError(
            "no lucebox server is running", hint="`lucebox up --host 0.0.0.0` shares one"
        )
    if status.lan is None or not status.lan.addresses:
        raise RunError(
            f"lucebox serves this PC alone ({status.url})",
            hint="serve on the LAN with `lucebox up --host 0.0.0.0` (an API key is made for it)",
        )
    urls = status.lan.chat_urls()
    # The QR holds an address, never the key: a photo of the screen must not hand it out.
    qr_url = urls[-1]
    if args.json:
        print_json({"chat_urls": list(urls), "api_base": f"{qr_url}v1", "qr_url": qr_url})
        return EXIT_OK
    import segno

    print("Chat with lucebox from a phone or another PC on this network:")
    for url in urls:
        print(f"  {url}")
    print(f"API base for apps: {qr_url}v1 (each person's key: `lucebox keys add NAME`)")
    drawn = io.StringIO()
    segno.make(qr_url, error="m").terminal(out=drawn, compact=True)
    print(drawn.getvalue(), end="")
    print(f"(the code opens {qr_url}; the page asks for a key)")
    return EXIT_OK


def cmd_find(args: argparse.Namespace, paths: Paths) -> int:
    found = announce.find(wait_s=args.wait_s)
    if args.json:
        print_json({"servers": [asdict(f) | {"url": f.url} for f in found]})
        return EXIT_OK
    if not found:
        print("lucebox: no lucebox server answered on this network", file=sys.stderr)
    for server in found:
        key = "key needed" if server.key_needed else "no key"
        print(f"{server.name:<20} {server.url}  {server.model} on {server.engine}, {key}")
    return EXIT_OK


def register(commands: Any, command: Command) -> None:
    share = command(
        "share", "the chat page's LAN address and a QR code for a phone", cmd_share, commands
    )
    add_json(share)
    finder = command("find", "lucebox servers on this network (mDNS)", cmd_find, commands)
    finder.add_argument(
        "--wait-s", type=float, default=announce.FIND_S, metavar="S", help="how long to listen"
    )
    add_json(finder)
