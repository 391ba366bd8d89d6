"""What the supervisor is built from: one engine process's parts, each apart from its loop.

- ``engineprocess``: the process started dying with lucebox, stopped by SIGTERM then SIGKILL,
  refused where its address is taken; ``enginelog``: the rotating log file of its output;
  ``readiness``: when it serves (health, then its warm-up); ``restartpolicy``: how many crashes
  and how long a backoff before giving up; ``cpurebuild``: the rebuild for a lower CPU baseline
  after an illegal instruction; ``enginedeath``: its death named from its last lines and the
  machine at that moment; ``serverevent``: what the supervisor reports of it.
"""
