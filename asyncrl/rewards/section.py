"""`config.rewards`: the reward workers and the user's reward plugins (modules that register
rewards of their own, imported here first so that `task.reward` can name theirs)."""

from __future__ import annotations

import importlib

from asyncrl.sections import Section, fail, int_at_least, positive, section


@section
class RewardsSection(Section):
    name = "rewards"
    workers: int
    timeout_s: float
    plugins: tuple[str, ...]  # modules, e.g. ('my_project.rewards',)

    def check(self) -> None:
        int_at_least("rewards.workers", self.workers, 1)
        positive("rewards.timeout_s", self.timeout_s)
        if not all(self.plugins):
            fail("rewards.plugins", self.plugins, "a tuple of module names, e.g. "
                 "('my_project.rewards',)")
        for module in self.plugins:
            try:
                importlib.import_module(module)
            except ImportError as error:
                fail("rewards.plugins", self.plugins,
                     f"module {module!r} cannot be imported: {error}")

    def pool(self):
        """A pool of reward workers as this section asks (asyncrl.rewards.pool.RewardPool)."""
        from asyncrl.rewards.pool import RewardPool

        return RewardPool(self.workers, self.timeout_s, plugins=self.plugins)
