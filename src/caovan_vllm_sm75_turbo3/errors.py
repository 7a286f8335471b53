"""The root of every exception this package raises, and the errors a user can cause.

    CaovanException          the root: every exception class of the package derives from it
      CaovanError            user-fixable; the CLI turns each into one clear line and an exit code
      TurboError             the sm_75 Turbo build refused a kernel (rewrite, ptxas): it builds plain
      (internal signals)     subclassed in place, e.g. warmup's StepError, caught where they are raised

Only CaovanError is caught as "the user's problem"; nothing catches the root itself.
"""

from __future__ import annotations


class CaovanException(Exception):
    """Root of the package's exceptions; catch a subclass, never this."""


class CaovanError(CaovanException):
    """A problem the user can fix; `str(err)` is the whole message meant for a human.

    `exit_code` is what the command line exits with (2: bad input or FAIL, by convention).
    """

    exit_code: int = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class TurboError(CaovanException):
    """The Turbo (sm_75 tensor-core) build of one kernel failed; the caller falls back to the plain build."""


class SettingError(CaovanError):
    """A `CAOVAN_*` variable, an additional-config key or a CLI flag has a value we cannot accept."""


class FactsError(CaovanError):
    """A facts file (`--facts` / `CAOVAN_FACTS`) cannot be read or is not facts JSON."""


class ModelError(CaovanError):
    """A model directory's config.json or safetensors index holds a value no model can have."""


class Turbo3Refused(CaovanError):
    """require-turbo3 is on and the accelerated path (our GDN prefill with Turbo) cannot be active.

    Raised before vLLM starts (the launcher, `register()`) and inside a vLLM process when our
    GDN prefill cannot serve it (plugin/dispatch).
    """
