"""Project exceptions.

Every error a user can cause (a wrong file, a bad parameter) is a `LanternError` whose message names
the file or parameter, what was expected, what was found, and how to fix it. Internal invariants use
`assert`; nothing here is for control flow.
"""
from __future__ import annotations

from pathlib import Path


class LanternError(Exception):
    """Base class of every error the pack raises on bad input."""


class CheckpointError(LanternError, ValueError):
    """A weights file cannot be used as asked. The message names file, expectation, finding and fix."""

    def __init__(self, path: str | Path | None, expected: str, found: str, fix: str):
        self.path = None if path is None else str(path)
        self.expected = expected
        self.found = found
        self.fix = fix
        where = f"'{self.path}'" if self.path else "the given weights"
        super().__init__(f"Cannot load {where}: expected {expected}, but found {found}. Fix: {fix}")


class ConfigError(LanternError, ValueError):
    """A parameter is out of range or inconsistent. The message names the parameter and the fix."""

    def __init__(self, name: str, expected: str, found: object, fix: str = ""):
        self.name = name
        message = f"Invalid {name}: expected {expected}, found {found!r}."
        if fix:
            message += f" Fix: {fix}"
        super().__init__(message)
