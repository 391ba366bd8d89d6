"""Models: the files a launch serves, where they come from, and the checks before an engine
sees them.

- reading a file: ``gguf`` (the header, bounded against hostile input), ``headerinfo`` (what a
  model's GGUF header says), ``modelfacts`` (the facts a plan needs), ``quant``.
- checks: ``guard`` (every refusal with its stable code), ``checkresult`` (a check's problems
  and verdict), ``draftguard`` (drafts, and a draft against its target), ``ondisk``.
- the store: ``modelsource`` (``hf:``, ``pypi:``, a repo by name, a path), ``pull`` (one pull
  per source kind: ``hubpull``, ``pypipull``), ``pullcheck`` (disk room, check and record),
  ``records`` (what is pulled: list, verify, remove), ``hubrepo`` (a Hub repo's files by name).
- ``presets``: the shipped model sets; ``shortname``: models by short name (``qwen3.6:27b``);
  ``projector``: vision projectors.
- updates: ``modelupdate`` (a newer revision on the Hub), ``revisions`` (the ones kept).
"""
