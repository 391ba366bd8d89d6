"""What ends a stream, as the front judges a stream the engine closed (frontwire.LAST_EVENT):
each API's last event in the spacings engines write, and events that only look like one."""

from __future__ import annotations

import pytest

from lucebox.engine.run.front.frontwire import LAST_EVENT


@pytest.mark.parametrize(
    "event",
    [
        b"data: [DONE]\n\n",
        b"data:[DONE]",
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
        b'event: message_stop\r\ndata: {"type": "message_stop"}',
        b'data: {"type" :  "message_stop"}',
        b'event: response.completed\ndata: {"response":{"id":"r"},"type":"response.completed"}',
        b"event: response.incomplete\ndata: {}",
        b'data: {"type":"response.failed"}',
    ],
)
def test_each_apis_last_event_ends_the_stream(event):
    assert LAST_EVENT.search(event)


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"choices":[{"delta":{"content":"[DONE]"}}]}',
        b'event: message_delta\ndata: {"type":"message_delta"}',
        b'event: response.output_text.delta\ndata: {"delta":"message_stop"}',
        b": keep-alive\n\n",
    ],
)
def test_other_events_do_not(event):
    assert not LAST_EVENT.search(event)
