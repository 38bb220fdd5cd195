"""Reading the project's JSON inputs (profiles, histograms) with errors that name the file."""

from __future__ import annotations

import json
import os
from typing import Any


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The JSON object in `path`; `what` names the file's role in the error ("latency model")."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return d
