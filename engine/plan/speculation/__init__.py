"""Speculative decoding in the plan: which mode a launch uses, when it stops paying, and the
measurement store that says so on this card.

- ``speculation``: the mode from the files, the engine and the user's choice; ``specguard``: the
  guard that shortens or stops drafts that slow decoding; ``measurements``: the store of rates
  measured on this card; ``workload``: the served requests next to the calibration's probes;
  ``spread``: a verdict's run-to-run spread and when two candidates run the probes again.
"""
