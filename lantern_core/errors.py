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


def shown(value) -> object:
    """A value as an error message quotes it: short strings and small values as they are, long strings cut,
    anything else by its type."""
    if isinstance(value, str):
        return value[:80]
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int too long to print, a structure nested too deep
        text = ""
    return value if 0 < len(text) <= 80 else f"a {type(value).__name__}"


def check_choice(name: str, value, options) -> None:
    """A choice given by name (a node's combo sent through /prompt, a command-line value): one of `options`."""
    if not isinstance(value, str) or value not in options:
        raise ConfigError(name, f"one of {list(options)}", shown(value), f"choose an entry of the '{name}' list")
