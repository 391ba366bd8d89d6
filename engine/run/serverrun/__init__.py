"""A single server's run: the engine supervised behind lucebox's front, sampled once ready.

- ``serverrun``: the run, with its one way to stop or restart; ``serverstatus``: what the run
  says of itself (the state file, the record `lucebox connect` reads).
"""
