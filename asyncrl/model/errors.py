"""Errors of the model package that config checks raise too: import-light (no JAX)."""

from asyncrl.errors import UserError


class ModelFileError(UserError, ValueError):
    """A model file or folder that cannot be loaded; the message names the file (and the
    tensor or field)."""
