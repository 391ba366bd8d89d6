"""Run: start the planned engine, keep it up, read its numbers, and measure speculation on it.

- ``supervisor`` (start, ready, restart, why it died), ``serverrun`` (the running server, its one
  way to stop or restart), ``specwatch`` (its speculation guard), ``runstate`` (the lock and the
  state file `status` reads), ``lastserved``, ``slots`` (warm prompts across restarts).
- per engine kind: ``enginerun`` (its log reader, sampler and warm-up), ``enginelog`` and
  ``metrics`` (llama-server's log reader and sampler), ``luceboxrun`` (the Lucebox engine's);
  ``sample`` is what both report; ``ownrequests`` tells lucebox's own requests (warm-up,
  probes) apart from clients' in the engine's log.
- a served set: ``servedsetrun``, ``servedsetproxy``, ``servedsetmodels``, ``admission``.
- measuring: ``calibrator`` and ``calibration`` (speculation chosen on this card), ``probes``,
  ``chat`` (one timed chat); ``worker`` is `lucebox worker`, an RPC peer.
"""
