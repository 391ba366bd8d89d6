"""Plan: the one planner turns (card, files or preset, flags + settings) into a launch.

- entry: ``planner`` (one model), ``servedsetplan`` and ``router`` (a served set), ``repoplan`` and
  ``quantchoice`` (a repo named by name), ``presetchoice`` (which preset a machine gets).
- inputs: ``options`` (flags over config.toml), ``modelfiles`` (the files of a launch),
  ``engineview`` (the engine planned for), ``flagtypes``.
- llama-server's memory: ``memory`` (the request and the plan, number by number), ``sizes``
  (what each term costs), ``layerchoice`` (where the weights go), ``ctxchoice`` (the KV type and
  context that fit), ``termreasons`` (why each term is what it is), ``devicesplit``,
  ``cardchoice``, ``hostram``, ``cpuread``, ``fitcheck`` (llama-fit-params beside the plan).
- the Lucebox engine: ``enginechoice`` (which kind serves: the pure rule), ``luceboxroute``,
  ``luceboxplan``, ``luceboxlaunch``; ``kvmodes`` (its long-context modes) and ``kvmodeview``
  (how they are shown, read by `status` without the planner).
- speculation: ``speculation``, ``specguard``, ``measurements`` (the store), ``workload``,
  ``agentprompt``.
- the result: ``launch`` (argv and environment by the engine kind's rules), ``launchplan``.
"""
