"""Engines: get each engine kind's pinned source, build it for this machine, install it, pick it.

- ``kinds``: the :class:`~kinds.EngineKind` interface and its two kinds, llama-server and the
  Lucebox engine; callers name a kind and ask it. ``kindname``: the kinds' names (no imports).
  ``known``: each kind's known sources (data).
- llama-server: ``source`` (the pinned sdist), ``build`` (cmake, the build cache), ``webui``,
  ``uibundle`` and ``nodejs`` (its web UI, and the bundle the front serves for an engine
  without one).
- the Lucebox engine: ``lucebox`` (the pinned ``server/`` tree), ``bsa`` (Block-Sparse-Attention
  in it, PFlash's fast kernel), ``luceboxbuild`` (dflash_server).
- both: ``registry`` (installed engines, manifests, the selection), ``install`` (publishing a
  build, ``engine add``, ``engine fetch``), ``sourcetree`` (a source tree checked against its
  digest before a build), ``cputarget`` (the CPU baseline every build targets), ``toolchain``
  (cmake, compilers, nvcc on this machine), ``toolkit`` (which CUDA toolkit; fetched from PyPI
  when none is here), ``update`` and ``updatestate`` (`engine update`, its rollback).
"""
