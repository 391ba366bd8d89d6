"""Widgets of the TUI: each renders values the engine computed and computes none itself."""
