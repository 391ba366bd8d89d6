"""The Textual front end of `lucebox up`: start-up checklist, preset choice, dashboard, chat.

Widgets render what ``lucebox.engine`` computes: pipeline steps (``StepEvent``), the plan, the
supervisor's events and the sampler's ``Sample`` stream. Blocking work (GPU probe, downloads,
builds) runs in a thread worker that only posts messages; the server runs in an async worker.

``app`` (the App: acts on the screens' requests), ``backend`` (what it asks of the engine),
``messages``, ``screens/``, ``widgets/``.
"""

from __future__ import annotations

from lucebox.app.tui.app import LuceboxApp, make_app

__all__ = ["LuceboxApp", "make_app"]
