"""How a running engine of each kind is read: one interface per kind.

- ``enginerun``: the interface (log reader, sampler, warm-up) and its two kinds; ``enginelog``
  and ``metrics``: llama-server's log reader and sampler; ``luceboxrun``: the Lucebox engine's;
  ``ownrequests``: lucebox's own requests told apart from clients' in the engine's log.
"""
