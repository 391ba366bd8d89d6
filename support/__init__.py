"""What the tests and the benchmarks share, both importing it from here.

- models: ``ggufgen`` (complete, loadable GGUFs of any shape, written with gguf-py),
  ``realmodels`` (SmolLM2 and Gemma 3 from their PyPI packages, the suite's engine home),
  ``pngimage``.
- servers: ``engineserver`` (the built llama-server on a model), ``smolserver`` (a home that uses
  the built engine), ``frontserver`` (lucebox's front on a thread), ``servedset`` (a set's
  homes), ``luceboxfake`` (the Lucebox engine's recorded-contract stand-in), ``uibuild``.
- the Hub and other hosts: ``hubserver`` (a local server speaking the Hub's protocol) over
  ``httpserver``; ``agentinstall`` (real coding-agent clients from npm and PyPI).
- plumbing: ``ports`` (free ports on loopback), ``health`` (the one wait for ``/health``).
"""
