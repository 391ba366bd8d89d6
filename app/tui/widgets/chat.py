"""A chat with the served model, to try it from the dashboard."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Input, Label, Static
from textual.worker import Worker

from lucebox.app.tui.widgets.readout import value_text
from lucebox.engine.core.api import CallError
from lucebox.engine.pipeline import Prepared
from lucebox.engine.plan.launch import url_of
from lucebox.engine.run.chat import stream_chat

IMAGE_COMMAND = "/image "
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".webp": "image/webp", ".gif": "image/gif", ".bmp": "image/bmp"}  # fmt: skip


def image_part(path: Path) -> dict[str, Any]:
    """An image file as the OpenAI ``image_url`` part the engine decodes (a data URI)."""
    kind = IMAGE_TYPES[path.suffix.lower()]
    data = base64.b64encode(path.read_bytes()).decode()
    return {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{data}"}}


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return " ".join(p["text"] if p["type"] == "text" else "[image]" for p in content)


class ChatPanel(Vertical):
    """Type a message, watch the reply stream in, with its time to first token and speed.
    ``/image PATH`` attaches an image to the next message when the model is served with vision."""

    def __init__(self, prepared: Prepared, id: str) -> None:
        super().__init__(id=id)
        self.prepared = prepared
        self.messages: list[dict[str, Any]] = []
        self.reply = ""
        self.replying: Worker[None] | None = None
        self.attached: dict[str, Any] | None = None
        """The image part the next message carries (``/image PATH``)."""

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="chat-scroll"):
            yield Static("", id="chat-transcript")
        yield Label("", id="chat-stats")
        yield Input(placeholder="Say something to the model, Enter sends", id="chat-input")

    def on_mount(self) -> None:
        self.border_title = "Chat"

    @on(Input.Submitted, "#chat-input")
    def send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        event.input.value = ""
        if text.startswith(IMAGE_COMMAND):
            self.attach(Path(text.removeprefix(IMAGE_COMMAND).strip()).expanduser())
            return
        content: str | list[dict[str, Any]] = text
        if self.attached is not None:
            content, self.attached = [{"type": "text", "text": text}, self.attached], None
        self.messages.append({"role": "user", "content": content})
        self.reply = ""
        self.query_one("#chat-stats", Label).update("waiting for the first token…")
        self.render_transcript()
        # The App's worker, so that the App's one handler sees it fail; it ends with the panel.
        self.replying = self.app.run_worker(
            self.stream_reply(),
            name="stream_reply",
            group="chat",
            exclusive=True,
            exit_on_error=False,
        )

    def attach(self, path: Path) -> None:
        """Keep the image at ``path`` for the next message, or say why it cannot be sent."""
        stats = self.query_one("#chat-stats", Label)
        vision = self.prepared.launch.vision
        if not vision.served:
            stats.update(Text(f"no images: served without vision ({vision.reason})", style="red"))
        elif path.suffix.lower() not in IMAGE_TYPES:
            stats.update(Text(f"{path.name}: not an image ({', '.join(IMAGE_TYPES)})", style="red"))
        elif not path.is_file():
            stats.update(Text(f"{path} does not exist", style="red"))
        else:
            self.attached = image_part(path)
            stats.update(f"image attached: {path.name} (sent with your next message)")

    def on_unmount(self) -> None:
        if self.replying is not None:
            self.replying.cancel()

    def render_transcript(self) -> None:
        transcript = Text()
        for message in self.messages:
            if message["role"] == "user":
                transcript.append("you  ", style="bold cyan")
            else:
                transcript.append("model ", style="bold green")
            transcript.append(_text_of(message["content"]) + "\n")
        if self.reply:
            transcript.append("model ", style="bold green")
            transcript.append(self.reply)
        self.query_one("#chat-transcript", Static).update(transcript)
        self.query_one("#chat-scroll", VerticalScroll).scroll_end(animate=False)

    async def stream_reply(self) -> None:
        stats = self.query_one("#chat-stats", Label)
        spec = self.prepared.server
        try:
            async for delta in stream_chat(
                url_of(spec), list(self.messages), api_key=self.prepared.api_key
            ):
                if not self.reply and delta.text:
                    stats.update(f"TTFT {value_text(delta.ttft_s, 's', 2)} · streaming…")
                self.reply += delta.text
                if delta.done:
                    ttft = value_text(delta.ttft_s, "s", 2)
                    speed = value_text(delta.tokens_per_s, "tok/s")
                    stats.update(f"TTFT {ttft} · {speed}")
                self.render_transcript()
        except CallError as exc:
            stats.update(Text(str(exc), style="red"))
            return
        self.messages.append({"role": "assistant", "content": self.reply})
        self.reply = ""
        self.post_message(self.ReplyDone())

    @dataclass
    class ReplyDone(Message):
        """A reply finished streaming."""
