"""A JetStream-style rollout engine: fixed decode slots, bucketed prefill, hot-swappable weights.

The engine is the device half of decoding. Its state is a `DecodeState` (the KV cache plus a
few [B] vectors, fixed shape, donated to every jitted call that updates it), and its calls
are JetStream's, weights an argument of each:

  1. `prefill(params, sequence, trajectory_ids=..., max_new_tokens=...)` runs the sequence
     (right-padded to the smallest bucket that fits; a resumed one, longer than any bucket,
     in chunks) into a one-row cache and draws the first token. Given G trajectory ids it is a
     GRPO group: one prefill, G first tokens, each from its own key.
  2. `insert(prefix, state, slots)` copies the prefix KV into the G slots and starts them.
  3. `generate(params, state)` runs `decode_steps` decode steps for all slots in one loop on
     device (a slot that stops stops there; budgets and stop tokens are checked on device).
     Every slot computes (the shapes are fixed); slots that are empty or finished do not
     advance and their outputs are marked invalid. New weights apply from the next dispatch
     on, without draining. The KV of earlier tokens is kept as the older weights computed it
     (as in PipelineRL); only a resume recomputes it.

The cache is either one contiguous row of max_len per slot, or (`page_size`) a pool of pages
(asyncrl/model/paged.py): `insert` is then told which pages the prefix goes to and `generate`
takes the page table, and attention reads pages through it. Which trajectory a slot holds,
which pages, and the tokens read back are host bookkeeping, kept by the caller:
`asyncrl.rollout.slots.Slots`, which a rollout instance composes with its engine. Freeing a
slot is host-only there too: a freed slot's device row keeps computing garbage until `insert`
overwrites it, which costs nothing extra (every slot computes anyway), and a freed paged row
is handed an empty table row, so it writes nowhere.

Random keys are fold_in(fold_in(key(seed), trajectory_id), token_index) (see sampling.py), so a
trajectory draws the same tokens in any slot of any engine with the same seed, and after a
resume it continues its own stream.
"""

from __future__ import annotations

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
from asyncrl.model.sampling import SamplingParams
from asyncrl.rollout.sampling import sample, token_keys


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


@dataclasses.dataclass(frozen=True)
class Prefix:
    """A prefilled sequence waiting for `insert`: its KV row and the G first tokens."""

    cache: KVCache  # k, v [L, 1, S, K, H]
    length: int  # tokens in the cache: prompt (+ resumed tokens); the first token's position
    token_index: int  # index of the first token among its trajectory's generated tokens
    tokens: jax.Array  # [G] int32 first tokens
    logprobs: jax.Array  # [G] f32
    policy_logprobs: jax.Array  # [G] f32
    done: jax.Array  # [G] bool
    trajectory_ids: jax.Array  # [G] uint32
    max_new_tokens: jax.Array  # [G] int32

    @property
    def group(self) -> int:
        return self.tokens.shape[0]


@dataclasses.dataclass(frozen=True)
class KVOptions:
    """How a rollout instance holds and reads its KV cache: the Engine's arguments of the
    same names, and the instance's preemption policy; plain data, so it crosses to a Ray
    actor."""

    page_size: int | None = None
    num_pages: int | None = None
    decode_steps: int = 1
    attention: str = "auto"
    preemption: str = "newest"

    def engine_kwargs(self) -> dict:
        return dict(page_size=self.page_size, num_pages=self.num_pages,
                    decode_steps=self.decode_steps, attention=self.attention)


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


def live_width(page_table: np.ndarray, num_pages: int) -> int:
    """The page-table columns a dispatch sends: the most pages any row holds (rows hold pages
    from column 0 on; `num_pages` marks none), rounded up to a power of two and capped at
    the table's width, so a dispatch reads the live pages and a run compiles at most
    log2(W) + 1 widths. Every page a dispatch can write is held before it (the caller tops
    rows up), so no write falls outside the columns sent."""
    held = int((page_table != num_pages).sum(axis=1).max(initial=0))
    return pow2_width(held, page_table.shape[1])


def pow2_width(held: int, width: int) -> int:
    """`held` columns rounded up to a power of two (at least one), at most `width`."""
    return min(width, 1 << max(held - 1, 0).bit_length())


# -- the engine ---------------------------------------------------------------------------------

class Engine:
    """Fixed-slot decode engine for one model on one (rollout) mesh: device state only.

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
            cache (asyncrl/model/paged.py): slots hold pages of this many positions, a GRPO
            group can share its prompt's pages, and attention reads pages, not rows.
        num_pages: the paged pool's size; default num_slots * max_len / page_size, the
            contiguous cache's memory.
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
                 decode_steps: int = 1, attention: str = "auto"):
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
        self.page_size = self.num_pages = self.pages_per_row = None
        if page_size is not None:
            if page_size < 1 or max_len % page_size:
                raise ValueError(f"page_size must divide max_len={max_len}, got {page_size}")
            width = max_len // page_size
            num_pages = num_slots * width if num_pages is None else int(num_pages)
            if num_pages < width:
                raise ValueError(f"num_pages={num_pages} cannot hold one sequence of max_len="
                                 f"{max_len} ({width} pages of {page_size})")
            resolve_backend(attention, config.head_dim)  # a kernel that cannot take it: now
            self.page_size, self.num_pages, self.pages_per_row = int(page_size), num_pages, width

        draw_kw = dict(seed=seed, sampling=sampling, stop_tokens=self.stop_tokens, max_len=max_len)
        new_row = functools.partial(KVCache.init, config, 1, max_len, self.cache_dtype)
        self._input_sharding = None
        pinned = {}  # function name -> output shardings, pinned only when there is a mesh
        if mesh is not None:
            rules = rules or ShardingRules.replicated()
            self._input_sharding = NamedSharding(mesh, PartitionSpec())
            abstract = jax.eval_shape(self._empty_state)
            cache = (NamedSharding(mesh, rules.spec(PAGE_AXES, abstract.cache.shape, mesh))
                     if self.page_size is not None else shardings_for(abstract.cache, mesh, rules))
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

    def _empty_state(self) -> DecodeState:
        b = self.num_slots
        cache = (KVCache.init(self.config, b, self.max_len, self.cache_dtype)
                 if self.page_size is None else
                 PagedKVCache.init_pages(self.config, self.num_pages, self.page_size,
                                         self.cache_dtype))
        return DecodeState(
            cache=cache,
            tokens=jnp.zeros((b,), jnp.int32), positions=jnp.zeros((b,), jnp.int32),
            trajectory_ids=jnp.zeros((b,), jnp.uint32), num_generated=jnp.zeros((b,), jnp.int32),
            max_new_tokens=jnp.zeros((b,), jnp.int32), done=jnp.ones((b,), bool))

    def init_decode_state(self) -> DecodeState:
        """All slots empty."""
        return self._new_state()

    def prefill(self, params, sequence, *, trajectory_ids: Sequence[int],
                max_new_tokens: int | Sequence[int] | None = None,
                token_index: int = 0) -> Prefix:
        """Prefills one sequence and draws a first token per trajectory id.

        sequence: a prompt, or (token_index > 0, a resume) prompt + the tokens drawn so far.
        trajectory_ids: G distinct ids in [0, 2**32): a GRPO group sharing this prompt.
        max_new_tokens: one budget for all, or one per id; counts the tokens drawn so far.
        """
        sequence = np.asarray(sequence, np.int32)
        if sequence.ndim != 1 or sequence.size == 0:
            raise ValueError(
                f"prompt must be a non-empty 1-D token sequence, got shape {sequence.shape}")
        if token_index == 0 and sequence.size > self.prompt_buckets[-1]:
            raise ValueError(f"prompt has {sequence.size} tokens, longer than the largest prompt "
                             f"bucket ({self.prompt_buckets[-1]}); buckets: {self.prompt_buckets}")
        if sequence.size > self.max_len - 1:
            raise ValueError(f"sequence of {sequence.size} tokens leaves no room to generate in "
                             f"max_len={self.max_len}")
        ids = [int(i) for i in trajectory_ids]
        if not ids or len(set(ids)) != len(ids) or not all(0 <= i < 2**32 for i in ids):
            # A repeated id would repeat its random stream: the group would hold copies.
            raise ValueError(f"trajectory_ids must be distinct ints in [0, 2**32), got {ids}")
        budgets = [self.max_new_tokens if max_new_tokens is None else max_new_tokens]
        if isinstance(max_new_tokens, (list, tuple, np.ndarray)):
            budgets = list(max_new_tokens)
        budgets = [int(b) for b in (budgets * len(ids) if len(budgets) == 1 else budgets)]
        if len(budgets) != len(ids) or min(budgets) <= token_index:
            raise ValueError(f"max_new_tokens must be > the {token_index} tokens drawn so far, "
                             f"one or one per trajectory id, got {max_new_tokens} for "
                             f"{len(ids)} ids")
        # A fresh prompt fits one bucket; a resumed sequence may not, so it is run in chunks of
        # the largest bucket, each attending to the cache the previous ones filled.
        cache, chunk, put = self._new_row(), self.prompt_buckets[-1], self._put
        for start in range(0, sequence.size, chunk):
            piece = sequence[start:start + chunk]
            padded = np.zeros((1, self._bucket(piece.size)), np.int32)
            padded[0, :piece.size] = piece
            cache, logits = self._prefill_chunk(params, cache, put(padded), put(np.int32(start)),
                                                put(np.int32(piece.size - 1)))
        device_ids = put(np.asarray(ids, np.uint32))
        device_budgets = put(np.asarray(budgets, np.int32))
        tokens, logprobs, policy_logprobs, done = self._first_tokens(
            logits, device_ids, put(np.int32(token_index)), put(np.int32(sequence.size)),
            device_budgets)
        return Prefix(cache, int(sequence.size), int(token_index), tokens, logprobs,
                      policy_logprobs, done, device_ids, device_budgets)

    def insert(self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int], *,
               pages: tuple[Sequence[int], Sequence[int]] | None = None) -> DecodeState:
        """Starts the prefix's G trajectories in G slots (donates decode_state).

        pages (paged cache only): (shared, private) from the caller's page table: the pages
        that take the prefix's full pages once, for all G, and one page per member for its
        copy of the partly filled last page (empty when the prefix ends on a page boundary).
        """
        slots = [int(s) for s in slots]
        if len(slots) != prefix.group:
            raise ValueError(f"prefix has {prefix.group} trajectories, got {len(slots)} "
                             f"slots {slots}")
        if len(set(slots)) != len(slots) or not all(0 <= s < self.num_slots for s in slots):
            raise ValueError(f"slots must be distinct, in [0, {self.num_slots}), got {slots}")
        put = self._put
        common = (put(np.asarray(slots, np.int32)), prefix.tokens, put(np.int32(prefix.length)),
                  prefix.trajectory_ids, put(np.int32(prefix.token_index)),
                  prefix.max_new_tokens, prefix.done)
        if self.page_size is None:
            return self._insert(decode_state, prefix.cache, *common)
        if pages is None:
            raise ValueError("a paged engine inserts into pages: pass pages=(shared, private)")
        shared, private = pages
        full, partial = divmod(prefix.length, self.page_size)
        if len(shared) != full or len(private) != (prefix.group if partial else 0):
            raise ValueError(f"a prefix of {prefix.length} positions for {prefix.group} "
                             f"sequences needs {full} shared pages and "
                             f"{prefix.group if partial else 0} private ones, got "
                             f"{len(shared)} and {len(private)}")
        shared_dest = np.full((self.pages_per_row,), self.num_pages, np.int32)
        shared_dest[:len(shared)] = shared
        private_dest = np.asarray(list(private) or [self.num_pages] * prefix.group, np.int32)
        partial_chunk = min(full, self.pages_per_row - 1)
        return self._insert_pages(decode_state, prefix.cache, put(shared_dest),
                                  put(private_dest), put(np.int32(partial_chunk)), *common)

    def generate(self, params, decode_state: DecodeState,
                 page_table: np.ndarray | None = None) -> tuple[DecodeState, StepResult]:
        """`decode_steps` decode steps with `params` (donates decode_state). A paged engine
        reads and writes the pages `page_table` [B, max_len / page_size] names (the pool's
        size where a row holds none): every page the dispatch can write must be there. Only
        its first `live_width` columns go to the device."""
        table = None
        if self.page_size is not None:
            if page_table is None:
                raise ValueError("a paged engine decodes through a page table: pass page_table")
            # A copy: on a CPU device_put may alias the host array, which the caller changes
            # before its next dispatch while this one may still be reading it. Only the
            # columns some row holds a page in: attention then reads live pages, not W.
            table = np.array(page_table, np.int32)
            table = self._put(table[:, :live_width(table, self.num_pages)])
        return self._generate(params, decode_state, table)

    # -- internals ------------------------------------------------------------------------------

    def _put(self, x: np.ndarray) -> jax.Array:
        """Explicit host-to-device copy (allowed under jax_transfer_guard('disallow'))."""
        return jax.device_put(x, self._input_sharding)

    def _bucket(self, length: int) -> int:
        return next(b for b in self.prompt_buckets if b >= length)
