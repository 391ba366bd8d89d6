"""The headless core of lucebox: everything but presentation.

Nothing in this package imports Textual, Rich or :mod:`lucebox.app`; the CLI's ``--json``
paths, ``lucebox serve`` and the tests run without a terminal.

The steps, layered in this order from the bottom: ``core``, ``machine``, ``models``,
``engines``, ``plan``, ``run``; above them ``runstart`` (a prepared launch to a supervised run),
``pipeline`` (`serve`'s steps), ``servedchoice`` (one model or a set: each front end asks
once), ``servedset`` (a set's steps), ``bench`` and ``doctor``.
"""
