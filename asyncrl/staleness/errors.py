"""Errors of the staleness protocol."""


class StalenessError(RuntimeError):
    """A protocol call that would break the staleness bound or the entry bookkeeping.

    The message always names the entry or buffer and what was wrong with the call.
    """
