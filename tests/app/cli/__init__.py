"""The command line's tests, one file per command group."""
