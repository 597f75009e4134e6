"""The one exception type that means "the user asked for something impossible".

Every layer raises :class:`PtdError` with a single human sentence; the CLI turns it into
one line on stderr and exit code 2. Anything else that escapes is a bug and keeps its
traceback.
"""


class PtdError(ValueError):
    """Bad input: an unknown preset, an indivisible plan, a missing file, a negative number."""
