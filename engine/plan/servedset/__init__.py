"""A served set in the plan: several models on one endpoint.

- ``servedsetplan``: every model by the one planner against one budget per device; ``router``:
  llama-server's router, its preset INI and command line; ``setsides``: the embedding and
  reranker models beside the set, in what it leaves.
"""
