"""Run: start the planned engine, keep it up, read its numbers, and measure on it.

- ``supervisor`` (start, ready, restart, why it died: ``death``, ``deathfacts``),
  ``specwatch`` (the running server's speculation guard), ``hang`` (when a busy engine counts
  as hung), ``runstate`` (the lock and the state file `status` reads),
  ``sample`` and ``servedsetmodels`` (what a run and a set's run report), ``gpustatus``,
  ``lastserved``, ``slots`` (warm prompts across restarts) and ``slotkeeper`` (a run's saves and
  restores), ``chat`` (one timed chat), ``rpcpeer`` (`lucebox worker`, an RPC peer), ``announce``
  (found on the LAN over mDNS), ``sideserver`` (the embedding and reranker models' processes
  beside the engine), ``sleep`` and ``sleepwatch`` (the engine stopped when idle, woken by the
  next request), ``prefixdisk`` (the Lucebox engine's disk prefix cache as the run reads it).
- ``serverrun/``: the running server, its one way to stop or restart; ``kinds/``: how a
  running engine of each kind is read; ``front/``: lucebox's front door;
  ``supervision/``: the supervisor's parts (the process, its log, readiness, restarts);
  ``calibrate/``: measuring on the card once idle; ``servedset/``: a served set's run.
- ``runsetup``: what a server run is built from (what it serves, how it watches its
  speculation, what it measures).
"""
