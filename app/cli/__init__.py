"""The ``lucebox`` command line: one module per command group, each with ``register``.

``parser`` builds the whole command line from the groups in the order ``lucebox --help``
shows them and runs a command; ``python -m lucebox.app.cli`` runs it (detached serves,
``bench --compare`` and installed systemd units start lucebox that way). The groups: ``serve``
(up, serve), ``status`` (status, down, logs: loads without the rest, for status bars),
``doctor``, ``plan`` and ``servedsetplan`` (presets, plan), ``models``, ``engine``, ``service``,
``config``, ``keys`` (a key per person), ``share`` (share and find on the LAN), ``bench``,
``connect``, ``launch``, ``worker``; ``modelrevisions`` (models update,
rollback, prune); ``__main__`` runs the parser. Shared: ``args`` (--json and the
launch options), ``handler`` (one error handler for every command), ``progress``.

This file stays empty of imports so that ``status`` loads fast.
"""
