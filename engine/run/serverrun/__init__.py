"""A single server's run: the engine supervised behind lucebox's front, sampled once ready.

- ``serverrun``: the run, with its one way to stop or restart; ``serverfront``: the front on the
  served address and the run's name on the LAN; ``serversampling``: the ready engine's log
  reader, sampler and hang watch; ``serverspec``: its speculation as `status` shows it and the
  served requests its guard and calibrations watch; ``serverstatus``: what the run says of
  itself (the state file, the record `lucebox connect` reads).
"""
