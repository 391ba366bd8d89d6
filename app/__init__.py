"""Front ends of lucebox: the CLI and the Textual TUI. They render what the engine computes.

``cli`` (the command line), ``tui`` (the Textual app), ``entry`` (the console script: `status`,
`down` and `logs` answer before the rest loads).
"""
