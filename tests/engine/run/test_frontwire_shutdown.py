"""A client connected when the front shuts down (`lucebox down` while a request runs): the
connection ends without a traceback on lucebox's output."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import asyncio
from lucebox.engine.run.front.frontwire import serve_connection

async def answer(exchange, request, body):
    await asyncio.sleep(100)  # a reply still running at shutdown

async def main():
    server = await asyncio.start_server(
        lambda r, w: serve_connection(r, w, answer), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 2\\r\\n\\r\\n"
    writer.write(head + b"{}")
    await writer.drain()
    await asyncio.sleep(0.3)
    server.close()

asyncio.run(main())
print("stopped")
"""


def test_a_connection_open_at_shutdown_ends_without_a_traceback():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "stopped"
    assert "Traceback" not in done.stderr and "CancelledError" not in done.stderr, done.stderr
