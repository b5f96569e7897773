"""The one exception type the CLI turns into a clean error line."""


class LocusError(Exception):
    """A user-facing error: printed as one line, exits with `code`, never a traceback."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code
