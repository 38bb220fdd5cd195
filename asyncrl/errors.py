"""The base class of every error a user causes and can fix: a misspelt flag or config field,
a value out of range, a missing, malformed or damaged file.

An entry point (`asyncrl.cli.run_main`) ends on a UserError with its one-line message and
exit status 2, no traceback: the message already says what to change. Anything else is a
bug and keeps its traceback. Import-light on purpose: config files and the simulator raise
these without loading JAX.
"""


class UserError(Exception):
    """Something the user can fix. The message names the culprit (the flag, the config field
    or the file) and what was expected, in one line."""
