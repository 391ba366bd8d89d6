"""A single server's run: the engine supervised behind lucebox's front, sampled once ready.

- ``serverrun``: the run, with its one way to stop or restart.
"""
