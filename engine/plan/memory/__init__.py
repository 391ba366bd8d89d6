"""llama-server's memory plan: what fits on the card, number by number (pure).

- ``request``: what a plan is asked for; ``memory``: the plan (``make_plan``); ``sizes``: what each
  term costs by the pinned engine's formulas; ``layerchoice``: where the weights go; ``ctxchoice``:
  the KV type and context that fit; ``termreasons``: why each term is what it is.
- several devices: ``devicesplit`` (layers dealt over GPUs and peers), ``cardchoice`` (one card
  alone or split).
- the host: ``hostram`` (the RAM left to the PC), ``cpuread`` (the context a CPU reads in time),
  ``agentprompt`` (a coding agent's first prompt: its time and whether it fits).
"""
