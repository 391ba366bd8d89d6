"""The headless core of lucebox: everything but presentation.

Nothing in this package imports Textual, Rich or :mod:`lucebox.app`; the CLI's ``--json``
paths, ``lucebox serve`` and the tests run without a terminal.
"""
