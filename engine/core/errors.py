"""One exception tree for lucebox; each class carries the exit code the CLI returns.

    LuceboxError                     exit 1: failed while running
    ├── UsageError                   exit 2: the command line or an input the user gave is wrong
    │   ├── PathsError               exit 2: LUCEBOX_HOME or a lucebox folder cannot be used
    │   ├── ConfigError              exit 2: config.toml is unreadable, corrupt or has bad values
    │   ├── PresetError              exit 2: a preset file is malformed (presets)
    │   └── ModelNameError           exit 2: a short name names no model, or several (shortname)
    ├── GuardRefusal                 exit 3: a guard refused (model check, plan, engine support)
    │   ├── HashMismatchError        exit 3: bytes differ from their published or recorded sha256
    │   ├── PlanRefusal              exit 3: a launch plan that must not start (planning)
    │   ├── SetRefusal               exit 3: a served set that must not start (setplan)
    │   └── ToolkitRefusal           exit 3: no CUDA toolkit builds for this driver/card (toolkit)
    ├── CancelledByUserError         exit 130: the user stopped it (Ctrl-C, quitting the TUI)
    ├── StoreVersionError            exit 1: a newer lucebox wrote the store (measurements)
    ├── FetchError                   exit 1: a model or the engine source could not be had
    │   ├── TransferError            exit 1: a download failed; its partial is kept
    │   │   └── TransferRefusedError exit 1: the server refused the file, 401/403/404
    │   ├── StoreError               exit 1: a model cannot be pulled, found or removed (records)
    │   │   └── HubUnreachableError  exit 1: the Hub did not answer (no network, offline) (hubrepo)
    │   └── SourceError              exit 1: engine source cannot be fetched or unpacked (source)
    ├── EngineSetupError             exit 1: no working engine binary could be made or found
    │   ├── BuildError               exit 1: cmake configure or build failed (build)
    │   ├── ToolkitError             exit 1: the CUDA toolkit cannot be fetched or set up (toolkit)
    │   └── EngineError              exit 1: an engine cannot be installed, run or found (registry)
    └── RunError                     exit 1: a server could not start, keep running or answer
        ├── PortInUseError           exit 1: another program holds the port (supervisor)
        ├── AlreadyServingError      exit 1: another lucebox server runs for this user (runstate)
        ├── CallError                exit 1: the server refused or broke off a call (api)
        ├── ModelListError           exit 1: a set's router gave no model list (routerlist)
        ├── ServiceError             exit 1: systemd refused a step (systemd)
        └── WorkerError              exit 1: the RPC server of `lucebox worker` stopped (rpcpeer)

A class defined in another module names it in brackets; tests/engine/core/test_errors.py keeps this
drawing and the code in step. Every message names the thing that is wrong and what to do next;
the CLI prints it as one line and never shows a traceback for these.
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


class ConfigError(UsageError):
    """config.toml cannot be read, parsed or validated, or cannot be written."""


class GuardRefusal(LuceboxError):
    """A guard refused: a model check failed, a plan does not fit, the engine cannot serve."""

    exit_code = EXIT_REFUSED

    def __init__(
        self, message: str, *, hint: str | None = None, problem_codes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, hint=hint)
        self.problem_codes = problem_codes
        """The model check's codes of the errors that refused (docs/contracts.md's strings)."""


class HashMismatchError(GuardRefusal):
    """A file's bytes differ from the sha256 published or recorded for them (``hash-mismatch``).

    One class wherever a hash is checked (downloads, the store, the engine source), so the
    same fault always reads and exits the same way.
    """


class CancelledByUserError(LuceboxError):
    """The user stopped the work (Ctrl-C, quitting the TUI); what was done so far is kept."""

    exit_code = EXIT_CANCELLED


class FetchError(LuceboxError):
    """A model or the engine source could not be had: from the network, or from the store
    that keeps what was fetched."""


class EngineSetupError(LuceboxError):
    """No working engine binary could be built, installed or found on this machine."""


class RunError(LuceboxError):
    """A server (or its service, or an RPC worker) could not start, keep running or answer."""


class TransferError(FetchError):
    """A download failed; the partial file (if any) is kept for a resume unless it is bad."""


class TransferRefusedError(TransferError):
    """The server refused the file (401, 403, 404, or another 4xx); retrying will not help."""

    def __init__(self, message: str, *, status: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status
