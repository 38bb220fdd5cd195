"""`config.rollout`: the engine's slots, lengths, KV pages and sampling, and its checks.

Import-light (a config is checked before JAX loads): the engine's option objects are built
by `sampling()` and `kv_options()`, which import them when called.
"""

from __future__ import annotations

from asyncrl.rollout.pages import ATTENTION_BACKENDS, PREEMPTION
from asyncrl.sections import Section, fail, int_at_least, positive, section


@section
class RolloutSection(Section):
    name = "rollout"
    group_size: int  # N responses per prompt (GRPO group)
    num_slots: int
    max_new_tokens: int
    prompt_bucket: int
    temperature: float
    top_k: int
    top_p: float
    page_size: int  # 0: a contiguous KV cache
    num_pages: int  # 0: num_slots × max_len / page_size
    preemption: str
    attention: str
    decode_steps_per_dispatch: int
    stall_timeout_s: float

    @property
    def max_len(self) -> int:
        """Positions one sequence may hold: its prompt bucket and its response budget."""
        return self.prompt_bucket + self.max_new_tokens

    def sampling(self):
        """The sampling asked for (rollout, and evaluation's sampled pass@k)."""
        from asyncrl.model.sampling import SamplingParams

        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def kv_options(self):
        """How an instance holds and reads its KV cache (asyncrl.rollout.engine.KVOptions)."""
        from asyncrl.rollout.engine import KVOptions

        return KVOptions(page_size=self.page_size or None, num_pages=self.num_pages or None,
                         decode_steps=self.decode_steps_per_dispatch, attention=self.attention,
                         preemption=self.preemption)

    def check(self) -> None:
        for field, minimum in (("group_size", 1), ("num_slots", 1), ("max_new_tokens", 1),
                               ("page_size", 0), ("num_pages", 0),
                               ("decode_steps_per_dispatch", 1)):
            int_at_least(f"rollout.{field}", getattr(self, field), minimum)
        positive("rollout.stall_timeout_s", self.stall_timeout_s)
        if not 0 < self.temperature:
            fail("rollout.temperature", self.temperature, "expected > 0 (sampling)")
        int_at_least("rollout.top_k", self.top_k, 0)
        if not 0 < self.top_p <= 1:
            fail("rollout.top_p", self.top_p, "expected a number in (0, 1] (1: no nucleus cut)")
        if self.group_size > self.num_slots:
            fail("rollout.group_size", self.group_size,
                 f"a group is prefilled into group_size slots at once; at most rollout.num_slots "
                 f"({self.num_slots})")
        if self.page_size and self.max_len % self.page_size:
            fail("rollout.page_size", self.page_size,
                 f"0 (contiguous) or a divisor of rollout.prompt_bucket + rollout.max_new_tokens "
                 f"= {self.max_len}")
        if self.num_pages and not self.page_size:
            fail("rollout.num_pages", self.num_pages, "0 unless rollout.page_size > 0")
        if self.num_pages and self.num_pages < self.max_len // self.page_size:
            fail("rollout.num_pages", self.num_pages,
                 f"at least one sequence of {self.max_len} positions: "
                 f"{self.max_len // self.page_size} pages of {self.page_size}")
        if self.preemption not in PREEMPTION:
            fail("rollout.preemption", self.preemption, f"one of {PREEMPTION}")
        if self.attention not in ATTENTION_BACKENDS:
            fail("rollout.attention", self.attention, f"one of {ATTENTION_BACKENDS}")

    def check_pool_admits_a_group(self, partial_rollout: bool) -> None:
        """What one group needs through its first dispatch (the prompt's full pages once, a
        private last page and the dispatch's growth each), or with partial rollout off
        (config.coordinator.partial_rollout) its whole budget each: a pool smaller than that
        could never admit it."""
        if not self.page_size:
            return
        ps, group = self.page_size, self.group_size
        width = self.max_len // ps
        need = self.prompt_bucket // ps + group * (1 + -(-self.decode_steps_per_dispatch // ps))
        if not partial_rollout:
            need = group * width
        pages = self.num_pages or self.num_slots * width
        if pages < need:
            field = "num_pages" if self.num_pages else "num_slots"
            fail(f"rollout.{field}", getattr(self, field),
                 f"a pool of {pages} pages of {ps} cannot admit a group of {group} "
                 f"(needs {need}" + ("" if partial_rollout else
                                     ": without partial rollout, each its whole budget") + ")")
