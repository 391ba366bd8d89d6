"""Screens of the TUI: each shows one stage and posts request messages for the App to act on.

``start`` (the checklist), ``presets`` (the first-run choice), ``dashboardbase`` (what the
dashboards share), ``dashboard`` (one model), ``servedsetdashboard`` (a set), ``log``,
``browser`` (the web chat), ``keys`` (a key per person), ``users`` (people served at once),
``sleep`` (when the engine sleeps to free the GPU), ``quit``.
"""
