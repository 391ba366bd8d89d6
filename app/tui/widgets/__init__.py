"""Widgets of the TUI: each renders values the engine computed and computes none itself.

``throughput`` (decode, prefill, first token), ``gpu``, ``trend`` (sparklines), ``readout``,
``steps`` (the checklist's rows), ``log``, ``chat``, ``models`` (a set's models).
"""
