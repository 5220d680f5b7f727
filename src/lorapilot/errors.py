"""The two kinds of failure the CLI contract distinguishes, mapped to exit codes by cli.py."""

from __future__ import annotations


class LorapilotError(Exception):
    """Base class: a failure with a one-paragraph message meant for the user."""

    exit_code = 1


class UsageError(LorapilotError):
    """Bad input (spec, data, paths, flags): exit 2, message names the file/line/key."""

    exit_code = 2


class CheckFailed(LorapilotError):
    """A protocol check failed (leak, mask mismatch, audit, verify mismatch): exit 1.

    `details` is merged into the verb's JSON output so scripts can see what failed.
    """

    exit_code = 1

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.details = details or {}
        self.view = None  # the verb's view of `details`, shown before the message if set
