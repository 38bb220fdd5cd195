"""A JetStream-style rollout engine: fixed decode slots, bucketed prefill, hot-swappable weights.

The device holds a `DecodeState`: the KV cache plus a few [B] vectors, fixed shape, donated to
every jitted call that updates it. The cache is either one contiguous row of max_len per slot,
or (`page_size`) a pool of pages that slots take as they grow (asyncrl/rollout/pages.py keeps
which, on the host): admission is then by free pages, a GRPO group shares its prompt's pages,
attention reads pages through a table (asyncrl/model/paged.py), and a dispatch that would
outgrow the pool is refused until `preempt` hands a sequence back, partial, to resume. The
host holds, per slot, the `Trajectory` being generated there (ids, tokens so far, log-probs,
the weight version of every token).

Slot lifecycle:

    EMPTY --insert--> RUNNING --(stop token / max_new_tokens / max_len)--> FINISHED
      ^                  |                                                    |
      +---- extract -----+---------- pop_finished / extract / free ----------+

  1. `prefill(params, prompt, trajectory_id=..., version=v)` runs the prompt (right-padded to
     the smallest bucket that fits) into a one-row cache and draws the first token. Given G
     trajectory ids it is a GRPO group: one prefill, G first tokens, each from its own key.
  2. `insert(prefix, state, slots)` copies the prefix KV into the G slots and starts them.
  3. `generate(params, state, version=v)` runs `decode_steps` decode steps for all slots in
     one loop on device (a slot that stops stops there; budgets and stop tokens are checked
     on device). Every slot
     computes (the shapes are fixed); slots that are empty or finished just don't advance and
     their outputs are ignored. `params` and `version` are arguments of each call, so new
     weights apply from the next step on, without draining; each token is tagged with the
     version passed with the weights that produced it. The KV of earlier tokens is kept as
     the older weights computed it (as in PipelineRL); only a resume recomputes it.
  4. `pop_finished()` hands back finished trajectories and frees their slots; `extract(slot)`
     interrupts a running one and returns it partial; `resume(params, trajectory, version=v)`
     re-prefills prompt + tokens so far (on this or any other engine) and continues it.

Freeing is host-only: a freed slot's device row keeps computing garbage until `insert`
overwrites it, which costs nothing extra (every slot computes anyway) and keeps `free` out of
the donated state's data flow.

Host bookkeeping runs one call behind the device: `generate` only dispatches and queues its
outputs; host records are brought up to date (one `device_get` for everything queued) by the
methods that read them. A caller may therefore dispatch several steps before reading any.

Random keys are fold_in(fold_in(key(seed), trajectory_id), token_index) (see sampling.py), so a
trajectory draws the same tokens in any slot of any engine with the same seed, and after a
resume it continues its own stream.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from asyncrl.model import KVCache, ModelConfig, PagedKVCache, ShardingRules, apply, shardings_for
from asyncrl.model.paged import resolve_backend
from asyncrl.model.sharding import PAGE_AXES
from asyncrl.rollout.pages import PREEMPTION, OutOfPages, PageTable
from asyncrl.rollout.messages import Trajectory
from asyncrl.rollout.sampling import SamplingParams, sample, token_keys


@flax.struct.dataclass
class DecodeState:
    """Device state of all slots. B = num_slots, S = max_len."""

    cache: KVCache | jax.Array  # k, v [L, B, S, K, H]; paged: the page pool [L, P, ps, 2K, H]
    tokens: jax.Array  # [B] int32: the last drawn token, input of the next step
    positions: jax.Array  # [B] int32: position of `tokens` in its sequence
    trajectory_ids: jax.Array  # [B] uint32
    num_generated: jax.Array  # [B] int32: tokens drawn so far (counting those before a resume)
    max_new_tokens: jax.Array  # [B] int32
    done: jax.Array  # [B] bool: finished or empty; such slots do not advance


@flax.struct.dataclass
class StepResult:
    """Outputs of one dispatch of k decode steps, one row per step, one entry per slot."""

    tokens: jax.Array  # [k, B] int32
    logprobs: jax.Array  # [k, B] f32 behaviour log-prob (the distribution sampled from)
    policy_logprobs: jax.Array  # [k, B] f32 log-prob at temperature 1, no truncation
    valid: jax.Array  # [k, B] bool: the slot was running, so this token is real
    done: jax.Array  # [k, B] bool: the slot is finished after this step


@dataclasses.dataclass
class Prefix:
    """A prefilled prompt waiting for `insert`: its KV row and the G first tokens."""

    cache: KVCache  # k, v [L, 1, S, K, H]
    length: int  # tokens in the cache: prompt (+ resumed tokens); the first token's position
    tokens: jax.Array  # [G] int32 first tokens
    logprobs: jax.Array  # [G] f32
    policy_logprobs: jax.Array  # [G] f32
    done: jax.Array  # [G] bool
    trajectory_ids: jax.Array  # [G] uint32
    max_new_tokens: jax.Array  # [G] int32
    records: tuple[Trajectory, ...]
    version: int
    inserted: bool = False


@dataclasses.dataclass(frozen=True)
class KVOptions:
    """How an engine holds and reads its KV cache (Engine's arguments of the same names);
    plain data, so it crosses to a Ray actor."""

    page_size: int | None = None
    num_pages: int | None = None
    reserve: str = "on_demand"
    preemption: str = "newest"
    decode_steps: int = 1
    attention: str = "auto"

    @classmethod
    def of_rollout(cls, rollout, partial_rollout: bool) -> "KVOptions":
        """From a run's rollout config. Without partial rollout a sequence must finish where
        it started, on one version, so it is given its whole budget's pages at admission."""
        return cls(page_size=rollout.page_size or None, num_pages=rollout.num_pages or None,
                   reserve="on_demand" if partial_rollout else "budget",
                   preemption=rollout.preemption, decode_steps=rollout.decode_steps_per_dispatch,
                   attention=rollout.attention)

    def as_kwargs(self) -> dict:
        return dataclasses.asdict(self)


# -- pure device functions (jitted per engine in Engine.__init__) ------------------------------

def _draw(logits, trajectory_ids, token_indices, token_positions, max_new_tokens, *, seed,
          sampling, stop_tokens, max_len):
    """Draws the token at `token_positions` and decides whether the trajectory ends with it.

    The one place the stop rule lives, shared by prefill and decode so the two cannot drift.
    """
    keys = token_keys(seed, trajectory_ids, token_indices)
    tokens, logprobs, policy_logprobs = sample(logits, keys, sampling)
    # The token at position max_len - 1 is the last one the cache has room to feed back.
    done = (token_indices + 1 >= max_new_tokens) | (token_positions >= max_len - 1)
    if stop_tokens:
        done |= jnp.isin(tokens, jnp.asarray(stop_tokens, jnp.int32))
    return tokens, logprobs, policy_logprobs, done


def _prefill_chunk(graphdef, params, cache, tokens, start, last_index):
    """Runs tokens [1, T] at positions start.. into cache; returns it and logits [V] at
    last_index (the chunk's last real token; the rest is right padding)."""
    positions = start + jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
    logits, cache = apply(graphdef, params, tokens, positions, cache, logits_at=last_index[None])
    return cache, logits[0, 0]


def _first_tokens(logits, trajectory_ids, token_index, position, max_new_tokens, **draw_kw):
    """The G first tokens of a prefix: the same logits [V], one key per trajectory id."""
    group = trajectory_ids.shape[0]
    rows = jnp.broadcast_to(logits, (group, logits.shape[-1]))
    indices = jnp.full((group,), token_index, jnp.int32)
    positions = jnp.full((group,), position, jnp.int32)
    return _draw(rows, trajectory_ids, indices, positions, max_new_tokens, **draw_kw)


def _insert(state, cache_row, slots, tokens, position, trajectory_ids, token_index,
            max_new_tokens, done):
    """Copies one prefix row into slots [G] and starts them at their first token."""
    group = slots.shape[0]
    cache = state.cache if cache_row is None else jax.tree.map(
        lambda full, row: full.at[:, slots].set(jnp.repeat(row, group, axis=1).astype(full.dtype)),
        state.cache, cache_row)
    return state.replace(
        cache=cache,
        tokens=state.tokens.at[slots].set(tokens),
        positions=state.positions.at[slots].set(position),
        trajectory_ids=state.trajectory_ids.at[slots].set(trajectory_ids),
        num_generated=state.num_generated.at[slots].set(token_index + 1),
        max_new_tokens=state.max_new_tokens.at[slots].set(max_new_tokens),
        done=state.done.at[slots].set(done))


def _insert_pages(state, cache_row, shared, private, partial_chunk, slots, tokens, position,
                  trajectory_ids, token_index, max_new_tokens, done):
    """`_insert` for a paged cache: the prefix row's full pages are written once to `shared`
    [W] (the pool size where none), its partly filled last page to each of `private` [G]."""
    pages = state.cache
    layers, _, size, combined, head_dim = pages.shape
    chunks = jnp.stack([cache_row.k[:, 0], cache_row.v[:, 0]], axis=3)  # [L, S, K, 2, H]
    chunks = chunks.reshape(layers, -1, size, combined, head_dim).astype(pages.dtype)
    pages = pages.at[:, shared].set(chunks, mode="drop")
    last = jnp.take(chunks, partial_chunk, axis=1)[:, None]  # [L, 1, ps, 2K, H]
    pages = pages.at[:, private].set(
        jnp.broadcast_to(last, (layers, private.shape[0], *last.shape[2:])), mode="drop")
    return _insert(state.replace(cache=pages), None, slots, tokens, position, trajectory_ids,
                   token_index, max_new_tokens, done)


def _generate(graphdef, params, state, page_table, *, steps, attention, **draw_kw):
    """`steps` decode steps for every slot, in one dispatch: feed `tokens` at `positions`,
    draw the next token; a slot that finishes stops advancing at once, on device."""

    def step(state, _):
        running = ~state.done
        if page_table is None:
            cache = state.cache
        else:
            cache = PagedKVCache(state.cache, page_table, writing=running, backend=attention)
        logits, cache = apply(graphdef, params, state.tokens[:, None],
                              state.positions[:, None], cache)
        tokens, logprobs, policy_logprobs, finished = _draw(
            logits[:, 0], state.trajectory_ids, state.num_generated, state.positions + 1,
            state.max_new_tokens, **draw_kw)
        done = state.done | (running & finished)
        state = state.replace(
            cache=cache if page_table is None else cache.pages,
            tokens=jnp.where(running, tokens, state.tokens),
            positions=jnp.where(running, state.positions + 1, state.positions),
            num_generated=jnp.where(running, state.num_generated + 1, state.num_generated),
            done=done)
        return state, StepResult(tokens, logprobs, policy_logprobs, running, done)

    return jax.lax.scan(step, state, None, length=steps)


# -- the engine ---------------------------------------------------------------------------------

class Engine:
    """Fixed-slot decode engine for one model on one (rollout) mesh.

    Args:
        graphdef: from `asyncrl.model.init_params` / `init_sharded`.
        config: the model's ModelConfig.
        num_slots: decode batch size B.
        max_len: cache length S per slot: prompt + generated tokens never exceed it.
        prompt_buckets: padded prompt lengths; one prefill compile each. A prompt longer than
            the largest is an error; a resumed sequence may be longer (prefilled in chunks).
        sampling: temperature / top-k / top-p.
        stop_tokens: tokens that end a trajectory (kept as its last token); default the
            config's eos_token_ids.
        max_new_tokens: default per-trajectory budget (prefill can override per request).
        seed: base of every trajectory's random stream.
        mesh, rules: where the decode state lives; params must already be on the same mesh.
            rules shard the KV cache (default: replicated).
        cache_dtype: KV dtype; default the config's param_dtype.
        page_size: None keeps one contiguous cache row of max_len per slot. An int pages the
            cache (asyncrl/model/paged.py): slots take pages of this many positions as they
            grow, a GRPO group shares its prompt's pages, and attention reads pages, not rows.
        num_pages: the paged pool's size; default num_slots * max_len / page_size, the
            contiguous cache's memory. Slots then outnumber what fits at max_len, and a
            dispatch that runs out of pages must `preempt` first.
        reserve: "on_demand" (pages as a sequence grows; a shortage preempts one) or "budget"
            (a sequence's whole budget at insert: it never waits or moves; partial rollout off).
        preemption: which sequence `preempt` hands back: "newest" (the last admitted, which
            has the least decoded to redo) or "longest" (holds the most pages).
        decode_steps: decode steps per `generate` dispatch, run in one loop on device; the
            weights, and so the version, change only between dispatches.
        attention: paged attention backend (asyncrl.model.paged.BACKENDS).
    """

    def __init__(self, graphdef: nnx.GraphDef, config: ModelConfig, *, num_slots: int,
                 max_len: int, prompt_buckets: Sequence[int] = (64, 128, 256),
                 sampling: SamplingParams = SamplingParams(),
                 stop_tokens: Sequence[int] | None = None, max_new_tokens: int | None = None,
                 seed: int = 0, mesh: Mesh | None = None, rules: ShardingRules | None = None,
                 cache_dtype=None, page_size: int | None = None, num_pages: int | None = None,
                 reserve: str = "on_demand", preemption: str = "newest", decode_steps: int = 1,
                 attention: str = "auto"):
        buckets = tuple(sorted(set(int(b) for b in prompt_buckets)))
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        if not 2 <= max_len <= config.max_seq_len:
            raise ValueError(f"max_len must be in [2, config.max_seq_len={config.max_seq_len}], "
                             f"got {max_len}")
        if not buckets or buckets[0] < 1 or buckets[-1] > max_len:
            raise ValueError(
                f"prompt_buckets must be in [1, max_len={max_len}], got {prompt_buckets}")
        self.config, self.num_slots, self.max_len = config, num_slots, max_len
        self.prompt_buckets, self.sampling, self.seed = buckets, sampling, seed
        self.stop_tokens = tuple(int(t) for t in (
            config.eos_token_ids if stop_tokens is None else stop_tokens))
        self.max_new_tokens = max_len if max_new_tokens is None else int(max_new_tokens)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.cache_dtype = jnp.dtype(cache_dtype or config.param_dtype)
        if decode_steps < 1:
            raise ValueError(f"decode_steps must be >= 1, got {decode_steps}")
        self.decode_steps = int(decode_steps)
        self.page_size = page_size
        self.pages: PageTable | None = None
        if page_size is not None:
            if page_size < 1 or max_len % page_size:
                raise ValueError(f"page_size must divide max_len={max_len}, got {page_size}")
            if reserve not in ("on_demand", "budget"):
                raise ValueError(f"reserve must be 'on_demand' or 'budget', got {reserve!r}")
            if preemption not in PREEMPTION:
                raise ValueError(f"preemption must be one of {PREEMPTION}, got {preemption!r}")
            width = max_len // page_size
            num_pages = num_slots * width if num_pages is None else int(num_pages)
            if num_pages < width:
                raise ValueError(f"num_pages={num_pages} cannot hold one sequence of max_len="
                                 f"{max_len} ({width} pages of {page_size})")
            resolve_backend(attention, config.head_dim)  # a kernel that cannot take it: now
            self.pages = PageTable(num_slots, num_pages, page_size, width)
            self.reserve, self.preemption = reserve, preemption

        draw_kw = dict(seed=seed, sampling=sampling, stop_tokens=self.stop_tokens, max_len=max_len)
        new_row = functools.partial(KVCache.init, config, 1, max_len, self.cache_dtype)
        self._input_sharding = None
        pinned = {}  # function name -> output shardings, pinned only when there is a mesh
        if mesh is not None:
            rules = rules or ShardingRules.replicated()
            self._input_sharding = NamedSharding(mesh, PartitionSpec())
            abstract = jax.eval_shape(self._empty_state)
            cache = (NamedSharding(mesh, rules.spec(PAGE_AXES, abstract.cache.shape, mesh))
                     if self.pages is not None else shardings_for(abstract.cache, mesh, rules))
            state = jax.tree.map(lambda _: self._input_sharding, abstract).replace(cache=cache)
            row = shardings_for(jax.eval_shape(new_row), mesh, rules)
            # Pinned on outputs, so a donated state keeps its layout step after step.
            pinned = {"new_state": state, "new_row": row, "prefill_chunk": (row, None),
                      "insert": state, "insert_pages": state, "generate": (state, None)}

        def jit(name, fn, **kwargs):
            if name in pinned:
                kwargs["out_shardings"] = pinned[name]
            return jax.jit(fn, **kwargs)

        self._new_state = jit("new_state", self._empty_state)
        self._new_row = jit("new_row", new_row)
        # Donation: the decode state (and a prefix row across prefill chunks) is updated in
        # place instead of copied; callers must drop the argument and keep the result.
        self._prefill_chunk = jit("prefill_chunk", functools.partial(_prefill_chunk, graphdef),
                                  donate_argnums=(1,))
        self._first_tokens = jit("first_tokens", functools.partial(_first_tokens, **draw_kw))
        self._insert = jit("insert", _insert, donate_argnums=(0,))
        self._insert_pages = jit("insert_pages", _insert_pages, donate_argnums=(0,))
        self._generate = jit("generate", functools.partial(
            _generate, graphdef, steps=self.decode_steps, attention=attention, **draw_kw),
            donate_argnums=(1,))

        self._slots: list[Trajectory | None] = [None] * num_slots
        # (tokens, logprobs, policy_logprobs, valid, done) on device, owners, version.
        self._pending: collections.deque = collections.deque()

    def _empty_state(self) -> DecodeState:
        b = self.num_slots
        cache = (KVCache.init(self.config, b, self.max_len, self.cache_dtype)
                 if self.pages is None else
                 PagedKVCache.init_pages(self.config, self.pages.num_pages, self.page_size,
                                         self.cache_dtype))
        return DecodeState(
            cache=cache,
            tokens=jnp.zeros((b,), jnp.int32), positions=jnp.zeros((b,), jnp.int32),
            trajectory_ids=jnp.zeros((b,), jnp.uint32), num_generated=jnp.zeros((b,), jnp.int32),
            max_new_tokens=jnp.zeros((b,), jnp.int32), done=jnp.ones((b,), bool))

    # -- device-side API (JetStream's) ----------------------------------------------------------

    def init_decode_state(self) -> DecodeState:
        """All slots empty. Host records are reset too: one engine drives one decode state."""
        self._slots = [None] * self.num_slots
        self._pending.clear()
        if self.pages is not None:
            for slot in list(self.pages.slots):
                self.pages.release_slot(slot)
        return self._new_state()

    def prefill(self, params, prompt, *, trajectory_id: int | Sequence[int], version: int,
                max_new_tokens: int | None = None) -> tuple[Prefix, jax.Array]:
        """Prefills one prompt and draws a first token per trajectory id.

        trajectory_id: one id, or G ids for a GRPO group sharing this prompt (< 2**32 each).
        max_new_tokens: one budget for all, or one per id.
        Returns the prefix for `insert` and the first tokens [G] (device array).
        """
        prompt = np.asarray(prompt, np.int32)
        if prompt.ndim != 1 or prompt.size == 0:
            raise ValueError(
                f"prompt must be a non-empty 1-D token sequence, got shape {prompt.shape}")
        if prompt.size > self.prompt_buckets[-1]:
            raise ValueError(f"prompt has {prompt.size} tokens, longer than the largest prompt "
                             f"bucket ({self.prompt_buckets[-1]}); buckets: {self.prompt_buckets}")
        single = isinstance(trajectory_id, (int, np.integer))
        ids = [trajectory_id] if single else list(trajectory_id)
        budgets = [self.max_new_tokens if max_new_tokens is None else max_new_tokens]
        if isinstance(max_new_tokens, (list, tuple, np.ndarray)):
            budgets = list(max_new_tokens)
        budgets = [int(b) for b in (budgets * len(ids) if len(budgets) == 1 else budgets)]
        if len(budgets) != len(ids) or min(budgets) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, one or one per trajectory id, got "
                             f"{max_new_tokens} for {len(ids)} ids")
        if not ids or len(set(ids)) != len(ids) or not all(0 <= i < 2**32 for i in ids):
            # A repeated id would repeat its random stream: the group would hold copies.
            raise ValueError(f"trajectory_id must be distinct ints in [0, 2**32), got {ids}")
        records = tuple(Trajectory(int(i), prompt, b) for i, b in zip(ids, budgets))
        return self._prefill(params, prompt, records, version)

    def resume(self, params, trajectory: Trajectory, *, version: int) -> tuple[Prefix, jax.Array]:
        """Re-prefills an extracted trajectory (prompt + tokens so far) to continue it here."""
        if trajectory.finished:
            raise ValueError(f"trajectory {trajectory.trajectory_id} already finished "
                             f"({trajectory.finish_reason}); nothing to resume")
        sequence = np.concatenate([trajectory.prompt, np.asarray(trajectory.tokens, np.int32)])
        return self._prefill(params, sequence, (trajectory.copy(),), version)

    def insert(self, prefix: Prefix, decode_state: DecodeState,
               slot: int | Sequence[int]) -> DecodeState:
        """Starts the prefix's G trajectories in G empty slots (donates decode_state)."""
        slots = [slot] if isinstance(slot, (int, np.integer)) else [int(s) for s in slot]
        if len(slots) != len(prefix.records):
            raise ValueError(f"prefix has {len(prefix.records)} trajectories, got {len(slots)} "
                             f"slots {slots}")
        if prefix.inserted:
            raise ValueError("this prefix was already inserted; prefill again to reuse a prompt")
        for s in slots:
            if not 0 <= s < self.num_slots:
                raise ValueError(f"slot {s} out of range [0, {self.num_slots})")
            if self._slots[s] is not None:
                raise ValueError(f"slot {s} holds trajectory {self._slots[s].trajectory_id}; "
                                 f"pop_finished, extract or free it first")
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots must be distinct, got {slots}")
        token_index = len(prefix.records[0].tokens)
        put = self._put
        if self.pages is None:
            decode_state = self._insert(
                decode_state, prefix.cache, put(np.asarray(slots, np.int32)), prefix.tokens,
                put(np.int32(prefix.length)), prefix.trajectory_ids, put(np.int32(token_index)),
                prefix.max_new_tokens, prefix.done)
        else:
            decode_state = self._insert_into_pages(prefix, decode_state, slots, token_index)
        prefix.inserted = True
        for s, record in zip(slots, prefix.records):
            self._slots[s] = record
        self._pending.append(((prefix.tokens, prefix.logprobs, prefix.policy_logprobs, None,
                               prefix.done), prefix.records, prefix.version))
        return decode_state

    def _insert_into_pages(self, prefix: Prefix, decode_state, slots, token_index):
        table, put, group = self.pages, self._put, len(slots)
        if not self.admits(prefix.length, group,
                           max(r.max_new_tokens for r in prefix.records) - token_index):
            raise OutOfPages(f"{table.free} free pages cannot hold a prefix of {prefix.length} "
                             f"positions for {group} sequences beside the running ones; check "
                             f"`admits` before prefill")
        shared, private = table.group_pages(prefix.length, group)
        shared_dest = np.full((table.width,), table.num_pages, np.int32)
        shared_dest[:len(shared)] = shared
        private_dest = np.asarray(private or [table.num_pages] * group, np.int32)
        partial_chunk = min(prefix.length // self.page_size, table.width - 1)
        decode_state = self._insert_pages(
            decode_state, prefix.cache, put(shared_dest), put(private_dest),
            put(np.int32(partial_chunk)), put(np.asarray(slots, np.int32)), prefix.tokens,
            put(np.int32(prefix.length)), prefix.trajectory_ids, put(np.int32(token_index)),
            prefix.max_new_tokens, prefix.done)
        for g, (slot, record) in enumerate(zip(slots, prefix.records)):
            limit = self._position_limit(prefix.length, record.max_new_tokens - token_index)
            table.assign(slot, shared + private[g:g + 1], prefix.length, limit)
            if self.reserve == "budget":
                table.reserve_all(slot)
        return decode_state

    def _position_limit(self, length: int, budget_left: int) -> int:
        """Positions a sequence prefilled to `length` can ever write (its last token is drawn,
        never fed back)."""
        return min(self.max_len, length + budget_left)

    def admits(self, length: int, group: int = 1, budget: int | None = None) -> bool:
        """Whether a prefix of `length` positions for `group` sequences with `budget` tokens
        each to draw fits in the free pages through its first dispatch, beside what the
        running sequences need for their next one. Always True for a contiguous cache."""
        table = self.pages
        if table is None:
            return True
        budget = self.max_new_tokens if budget is None else budget
        full, partial = divmod(length, self.page_size)
        held = full + (1 if partial else 0)
        ahead = self.max_len if self.reserve == "budget" else self.decode_steps
        grow = table.pages_for(min(self._position_limit(length, budget), length + ahead)) - held
        need = full + group * ((1 if partial else 0) + max(grow, 0))
        if need > table.num_pages:  # waiting would never help
            raise OutOfPages(f"a prefix of {length} positions for {group} sequences needs {need} "
                             f"pages through its first dispatch; the pool has {table.num_pages}")
        running = sum(table.shortfall(self.decode_steps, self._running_slots()).values())
        return need + running <= table.free

    def preempt(self) -> list[Trajectory]:
        """Hands back running sequences, partial, until the next dispatch's pages fit (their
        records: resume them here or elsewhere). Empty when nothing needs to move."""
        if self.pages is None:
            return []
        self._sync()
        victims = []
        while True:
            running = self._running_slots()
            short = sum(self.pages.shortfall(self.decode_steps, running).values())
            if short <= self.pages.free or not running:
                return victims
            held = self.pages.slots
            if self.preemption == "newest":
                victim = max(running, key=lambda s: held[s].order)
            else:
                victim = max(running, key=lambda s: len(held[s].pages))
            victims.append(self.extract(victim))

    def _running_slots(self) -> list[int]:
        return [s for s, r in enumerate(self._slots) if r is not None and not r.finished]

    def kv_pages(self) -> tuple[int, int]:
        """(used, total) pages; a contiguous cache counts one page of max_len per slot."""
        if self.pages is None:
            return sum(r is not None for r in self._slots), self.num_slots
        return self.pages.used, self.pages.num_pages

    def generate(self, params, decode_state: DecodeState, *,
                 version: int) -> tuple[DecodeState, StepResult]:
        """`decode_steps` decode steps with `params`; their tokens are tagged `version`
        (donates decode_state). Paged: raises OutOfPages, dispatching nothing, when the
        running sequences' next pages do not fit; `preempt` makes room."""
        table = None
        if self.pages is not None:
            self.pages.top_up(self.decode_steps, self._running_slots())
            # A copy: on a CPU device_put may alias the host array, which the next top-up
            # changes while this dispatch may still be reading it.
            table = self._put(self.pages.table.copy())
        decode_state, result = self._generate(params, decode_state, table)
        outputs = (result.tokens, result.logprobs, result.policy_logprobs, result.valid,
                   result.done)
        self._pending.append((outputs, tuple(self._slots), int(version)))
        return decode_state, result

    # -- host-side API ------------------------------------------------------------------------

    def free_slots(self) -> list[int]:
        return [s for s, record in enumerate(self._slots) if record is None]

    def slot_records(self) -> list[Trajectory | None]:
        """The record in each slot as of the last host sync; no device wait (for monitoring)."""
        return list(self._slots)

    def trajectory(self, slot: int) -> Trajectory | None:
        """The live record in `slot` (up to date; not a copy)."""
        self._sync()
        return self._slots[slot]

    def running(self) -> dict[int, Trajectory]:
        """slot -> record of every trajectory still generating."""
        self._sync()
        return {s: r for s, r in enumerate(self._slots) if r is not None and not r.finished}

    def pop_finished(self) -> list[Trajectory]:
        """Finished trajectories, in slot order; their slots become free."""
        self._sync()
        done = []
        for s, record in enumerate(self._slots):
            if record is not None and record.finished:
                done.append(record)
                self._vacate(s)
        return done

    def extract(self, slot: int) -> Trajectory:
        """Removes the trajectory in `slot`, running (then partial) or finished, and returns it."""
        self._sync()
        record = self._slots[slot]
        if record is None:
            raise ValueError(f"slot {slot} is empty")
        self._vacate(slot)
        return record

    def free(self, slot: int) -> None:
        """Drops whatever `slot` holds (an aborted trajectory): host-only, see module docstring."""
        self._vacate(slot)

    def _vacate(self, slot: int) -> None:
        # Its pages may go to another sequence at once: dispatches already queued still run
        # before any insert that reuses them (each takes the state the previous one returned),
        # and later ones send this row's table empty, so its writes are dropped.
        self._slots[slot] = None
        if self.pages is not None:
            self.pages.release_slot(slot)

    # -- internals ------------------------------------------------------------------------------

    def _put(self, x: np.ndarray) -> jax.Array:
        """Explicit host-to-device copy (allowed under jax_transfer_guard('disallow'))."""
        return jax.device_put(x, self._input_sharding)

    def _bucket(self, length: int) -> int:
        return next(b for b in self.prompt_buckets if b >= length)

    def _prefill(self, params, sequence, records, version) -> tuple[Prefix, jax.Array]:
        length = sequence.size
        if length > self.max_len - 1:
            raise ValueError(f"sequence of {length} tokens leaves no room to generate in "
                             f"max_len={self.max_len}")
        # A fresh prompt fits one bucket; a resumed sequence may not, so it is run in chunks of
        # the largest bucket, each attending to the cache the previous ones filled.
        cache, chunk, put = self._new_row(), self.prompt_buckets[-1], self._put
        for start in range(0, length, chunk):
            piece = sequence[start:start + chunk]
            padded = np.zeros((1, self._bucket(piece.size)), np.int32)
            padded[0, :piece.size] = piece
            cache, logits = self._prefill_chunk(params, cache, put(padded), put(np.int32(start)),
                                                put(np.int32(piece.size - 1)))
        ids = put(np.asarray([r.trajectory_id for r in records], np.uint32))
        budgets = put(np.asarray([r.max_new_tokens for r in records], np.int32))
        tokens, logprobs, policy_logprobs, done = self._first_tokens(
            logits, ids, put(np.int32(len(records[0].tokens))), put(np.int32(length)), budgets)
        prefix = Prefix(cache, length, tokens, logprobs, policy_logprobs, done, ids, budgets,
                        records, int(version))
        return prefix, tokens

    def _sync(self) -> None:
        """Appends every queued step's tokens to its owners' records (one device_get)."""
        if not self._pending:
            return
        pending = list(self._pending)
        self._pending.clear()
        host = jax.device_get([outputs for outputs, _, _ in pending])
        stops = set(self.stop_tokens)
        for outputs, (_, owners, version) in zip(host, pending):
            tokens, logprobs, policy_logprobs, valid, done = outputs
            if valid is None:  # an insert's first tokens: one row, every member real
                tokens, logprobs, policy_logprobs, done = (
                    x[None] for x in (tokens, logprobs, policy_logprobs, done))
                valid = np.ones_like(done)
            for step in range(tokens.shape[0]):  # a dispatch's decode steps, in order
                for i, record in enumerate(owners):
                    # Owners are a snapshot from dispatch time: a slot freed or refilled since
                    # then still credits the trajectory that was in it.
                    if record is None or record.finished or not valid[step, i]:
                        continue
                    token = int(tokens[step, i])
                    record.tokens.append(token)
                    record.logprobs.append(float(logprobs[step, i]))
                    record.policy_logprobs.append(float(policy_logprobs[step, i]))
                    record.versions.append(version)
                    if done[step, i]:
                        record.finish_reason = "stop" if token in stops else "length"


