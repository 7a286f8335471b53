"""Errors a user can cause. The CLI turns each into one clear line and an exit code."""

from __future__ import annotations


class CaovanError(Exception):
    """A problem the user can fix; `str(err)` is the whole message meant for a human.

    `exit_code` is what the command line exits with (2: bad input or FAIL, by convention).
    """

    exit_code: int = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class SettingError(CaovanError):
    """A `CAOVAN_*` variable, an additional-config key or a CLI flag has a value we cannot accept."""


class FactsError(CaovanError):
    """A facts file (`--facts` / `CAOVAN_FACTS`) cannot be read or is not facts JSON."""


class ModelError(CaovanError):
    """A model directory's config.json or safetensors index holds a value no model can have."""
