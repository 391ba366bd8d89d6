"""The Lucebox engine (``dflash_server``) in the plan: its route, memory, flags and modes (pure).

- ``luceboxroute``: the planner's route to it (which engine, and the launch when it serves);
  ``luceboxplan``: its memory plan and flags; ``luceboxlaunch``: flags to argv; ``luceboxfit``:
  what each known build holds beyond the modelled terms; ``luceboxdevices``: two GPUs.
- ``diskcache``: its disk prefix cache (a folder per build and KV types, a budget from disk).
- long context: ``kvmodes`` (its modes, measured on this card) and ``kvmodeview`` (how they are
  shown, read by `status` without the planner).
"""
