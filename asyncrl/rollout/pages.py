"""Host bookkeeping of a paged KV cache: which pages each decode slot holds.

Pages are reference-counted so a GRPO group's G samples share the pages their prompt filled
(each holds a private copy of the partly filled last page only); a page returns to the free
pool when the last slot holding it lets go. The device never allocates: before every decode
dispatch the engine tops each running slot up to the pages that dispatch can write, and the
page table goes to the device with the call.
"""

from __future__ import annotations

import dataclasses

import numpy as np


# Which running sequence a short pool hands back (Slots.preempt).
PREEMPTION = ("newest", "longest")
# asyncrl.model.paged.BACKENDS, for config checks that load no model (a test keeps them equal).
ATTENTION_BACKENDS = ("auto", "gather", "tpu_ragged", "gpu_paged")


class OutOfPages(RuntimeError):
    """The next dispatch needs more pages than are free: preempt a sequence first."""


@dataclasses.dataclass
class SlotPages:
    pages: list[int]  # in position order: page w holds positions [w * size, (w + 1) * size)
    start: int  # the position of the slot's first decode input (the prefilled length)
    limit: int  # positions the slot can ever write: min(max_len, start + budget left)
    steps: int = 0  # decode steps dispatched since insert (an upper bound on steps run)
    order: int = 0  # admission order, for the `newest` preemption policy


class PageTable:
    """Pages of `num_slots` rows over a pool of `num_pages` pages of `page_size` positions."""

    def __init__(self, num_slots: int, num_pages: int, page_size: int, pages_per_row: int):
        self.num_pages, self.page_size, self.width = num_pages, page_size, pages_per_row
        self.table = np.full((num_slots, pages_per_row), num_pages, np.int32)
        self.refs = np.zeros((num_pages,), np.int32)
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low pages first
        self.slots: dict[int, SlotPages] = {}
        self._admitted = 0
        self.prompt_pages_shared = 0  # pages a group did not fill again, summed
        self.prompt_pages_total = 0  # prompt pages G separate prefills would have filled

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.num_pages - len(self._free)

    def pages_for(self, positions: int) -> int:
        return -(-positions // self.page_size)

    def take(self, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfPages(f"{count} pages needed, {len(self._free)} free")
        taken = [self._free.pop() for _ in range(count)]
        self.refs[taken] += 1
        return taken

    def release(self, pages) -> None:
        for page in pages:
            self.refs[page] -= 1
            if self.refs[page] == 0:
                self._free.append(int(page))

    def group_pages(self, length: int, group: int) -> tuple[list[int], list[int]]:
        """Pages for a prefix of `length` positions shared by `group` slots: the full pages
        once (held `group` times) and one private copy of a partly filled last page each."""
        full, partial = divmod(length, self.page_size)
        shared = self.take(full)
        self.refs[shared] += group - 1
        private = self.take(group) if partial else []
        self.prompt_pages_total += group * self.pages_for(length)
        self.prompt_pages_shared += (group - 1) * full
        return shared, private

    def assign(self, slot: int, pages: list[int], start: int, limit: int) -> None:
        self.release_slot(slot)
        self._admitted += 1
        self.slots[slot] = SlotPages(list(pages), start, limit, 0, self._admitted)
        self._write_row(slot)

    def release_slot(self, slot: int) -> None:
        held = self.slots.pop(slot, None)
        if held is not None:
            self.release(held.pages)
            self.table[slot] = self.num_pages

    def shortfall(self, steps: int, running) -> dict[int, int]:
        """slot -> pages it lacks to run `steps` more decode steps (running slots only)."""
        short = {}
        for slot in running:
            held = self.slots[slot]
            positions = min(held.limit, held.start + held.steps + steps)
            missing = self.pages_for(positions) - len(held.pages)
            if missing > 0:
                short[slot] = missing
        return short

    def top_up(self, steps: int, running) -> None:
        """Gives every running slot the pages `steps` more decode steps can write, and counts
        the steps as dispatched. Raises OutOfPages (changing nothing) if the pool is short."""
        short = self.shortfall(steps, running)
        if sum(short.values()) > len(self._free):
            raise OutOfPages(f"the next dispatch needs {sum(short.values())} more pages, "
                             f"{len(self._free)} free")
        for slot, missing in short.items():
            self._grow(slot, missing)
        for slot in running:
            self.slots[slot].steps += steps

    def reserve_all(self, slot: int) -> None:
        """Gives `slot` every page it can ever write (its limit), up front."""
        held = self.slots[slot]
        self._grow(slot, self.pages_for(held.limit) - len(held.pages))

    def _grow(self, slot: int, count: int) -> None:
        if count > 0:
            self.slots[slot].pages += self.take(count)
            self._write_row(slot)

    def _write_row(self, slot: int) -> None:
        pages = self.slots[slot].pages
        self.table[slot] = self.num_pages
        self.table[slot, :len(pages)] = pages
