"""Errors a user can cause: printed as one line, with a non-zero exit code, no traceback."""


class UserError(Exception):
    """A message for the person at the terminal, and the exit code to leave with."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
