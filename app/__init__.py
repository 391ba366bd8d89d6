"""Front ends of lucebox: the CLI and the Textual TUI. They render what the engine computes."""
