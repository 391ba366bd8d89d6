"""One exception tree for lucebox; each class carries the exit code the CLI returns.

    LuceboxError                 exit 1: failed while running
    ├── UsageError               exit 2: the command line or an input the user gave is wrong
    │   └── PathsError           LUCEBOX_HOME or a lucebox folder cannot be used
    ├── ConfigError              exit 2: config.toml is unreadable, corrupt or has bad values
    ├── GuardRefusal             exit 3: a guard refused (model check, plan, engine support)
    ├── NotAvailableError        exit 1: the command's capability has not landed yet
    └── CancelledByUserError     exit 130: the user stopped it (Ctrl-C, quitting the TUI)

Every message names the thing that is wrong and what to do next; the CLI prints it as one
line and never shows a traceback for these.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_CANCELLED = 130
"""128 + SIGINT, what a shell reports for Ctrl-C."""


class LuceboxError(Exception):
    """Base of every error lucebox reports to a user."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(LuceboxError):
    """The user asked for something that cannot be done as asked."""

    exit_code = EXIT_USAGE


class PathsError(UsageError):
    """A lucebox folder (or LUCEBOX_HOME) cannot be created or written."""


class ConfigError(LuceboxError):
    """config.toml cannot be read, parsed or validated, or cannot be written."""

    exit_code = EXIT_USAGE


class GuardRefusal(LuceboxError):
    """A guard refused: a model check failed, a plan does not fit, the engine cannot serve."""

    exit_code = EXIT_REFUSED

    def __init__(
        self, message: str, *, hint: str | None = None, problem_codes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, hint=hint)
        self.problem_codes = problem_codes
        """The model check's codes of the errors that refused (DESIGN.md's stable strings)."""


class NotAvailableError(LuceboxError):
    """The command exists but its capability has not landed in this version."""


class CancelledByUserError(LuceboxError):
    """The user stopped the work (Ctrl-C, quitting the TUI); what was done so far is kept."""

    exit_code = EXIT_CANCELLED
