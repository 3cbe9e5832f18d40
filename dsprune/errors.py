"""One error type for bad input, so the CLI can print one clear line instead of a traceback."""


class DsPruneError(ValueError):
    """Bad input named by file, line or field; raised before anything is written."""
