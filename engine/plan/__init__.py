"""Plan: the one planner turns (card, files or preset, flags + settings) into a launch.

- entry: ``planner`` (one model; ``specchoice``: its speculation and the store's keys);
  ``servedset/`` (a set); ``sources/`` (a preset or a repo chosen for the machine).
- inputs: ``options`` (flags over config.toml), ``flagtypes``, ``modelfiles`` (the files of a
  launch), ``engineview`` (each engine kind's build, found once by the caller).
- ``memory/``: llama-server's memory plan; ``speculation/``: the speculation mode, its guard and
  the measurement store; ``lucebox/``: the Lucebox engine's route, plan and modes.
- which engine: ``enginechoice`` (the rule), ``engineverdict`` (the measured verdict).
- around them: ``visionplan`` (the projector), ``chatdefaults`` (template and thinking),
  ``samplingdefaults`` (the sampling a request that says none gets),
  ``fitcheck`` (llama-fit-params beside the plan), ``sidemodels`` and ``sideplan`` (embedding and
  reranker models in what the chat plan leaves), ``users`` (people served at once),
  ``savedslots`` (llama-server's saved conversations: where, and their disk budget).
- rates measured on this machine beside the speculation's: ``prefillrates`` (the CPU's prompt
  read, per model), ``placementrates`` (the Lucebox engine's two-card placements).
- the result: ``launch`` (argv and environment by the engine kind's rules), ``launchplan``.
"""
