"""Screens of the TUI: each shows one stage and posts request messages for the App to act on."""
