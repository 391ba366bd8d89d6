"""The TUI's tests: Textual's pilot over a scripted backend, and snapshots."""
