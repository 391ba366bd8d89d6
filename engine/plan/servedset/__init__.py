"""A served set in the plan: several models on one endpoint.

- ``servedsetplan``: every model by the one planner against one budget per device;
  ``setplan``: the set's plan as a value (its members, their launch plans); ``setshare``:
  models sharing one device, how many fit at once; ``cardplacement``: a model alone on a card
  where one holds it; ``memberreplan``: one model of a running set planned again.
- ``router``: llama-server's router, its preset INI and command line; ``setsides``: the
  embedding and reranker models beside the set, in what it leaves.
"""
