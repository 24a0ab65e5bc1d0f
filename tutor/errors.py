"""The one exception type that reaches the user as a single clear line (exit code 2)."""


class UserError(ValueError):
    """Bad input the user can fix: printed as one line on stderr, exit code 2, never a traceback."""
