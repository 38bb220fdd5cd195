"""The console progress bar of a run: steps, ETA and the figures a user watches."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

_SHOWN = {"reward_mean": "reward", "staleness_max": "stale", "response_length": "len",
          "loss": "loss", "rollout_tok_s": "tok/s"}


class Progress:
    def __init__(self, total_steps: int):
        self.total = total_steps
        self._bar: tqdm | None = None

    def start(self, step: int) -> None:
        self._bar = tqdm(total=self.total, initial=step, desc="train", unit="step",
                         file=sys.stderr, dynamic_ncols=True)

    def update(self, step: int, figures: dict[str, Any]) -> None:
        if self._bar is None:
            return
        self._bar.set_postfix({short: f"{figures[name]:.3g}" for name, short in _SHOWN.items()
                               if isinstance(figures.get(name), (int, float))}, refresh=False)
        self._bar.update(step - self._bar.n)

    def note(self, text: str) -> None:
        """A line above the bar (evaluations, resumes): what a user should see without -v."""
        tqdm.write(text, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
