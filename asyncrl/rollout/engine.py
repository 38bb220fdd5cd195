"""A JetStream-style rollout engine: fixed decode slots, bucketed prefill, hot-swappable weights.

The device holds a `DecodeState`: one KV-cache row per slot plus a few [B] vectors, fixed shape,
donated to every jitted call that updates it. The host holds, per slot, the `Trajectory` being
generated there (ids, tokens so far, log-probs, the weight version of every token).

Slot lifecycle:

    EMPTY --insert--> RUNNING --(stop token / max_new_tokens / max_len)--> FINISHED
      ^                  |                                                    |
      +---- extract -----+---------- pop_finished / extract / free ----------+

  1. `prefill(params, prompt, trajectory_id=..., version=v)` runs the prompt (right-padded to
     the smallest bucket that fits) into a one-row cache and draws the first token. Given G
     trajectory ids it is a GRPO group: one prefill, G first tokens, each from its own key.
  2. `insert(prefix, state, slots)` copies the prefix KV into the G slots and starts them.
  3. `generate(params, state, version=v)` runs one decode step for all slots. Every slot
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

from asyncrl.model import KVCache, ModelConfig, ShardingRules, apply, shardings_for
from asyncrl.rollout.messages import Trajectory
from asyncrl.rollout.sampling import SamplingParams, sample, token_keys


@flax.struct.dataclass
class DecodeState:
    """Device state of all slots. B = num_slots, S = max_len."""

    cache: KVCache  # k, v [L, B, S, K, H]
    tokens: jax.Array  # [B] int32: the last drawn token, input of the next step
    positions: jax.Array  # [B] int32: position of `tokens` in its sequence
    trajectory_ids: jax.Array  # [B] uint32
    num_generated: jax.Array  # [B] int32: tokens drawn so far (counting those before a resume)
    max_new_tokens: jax.Array  # [B] int32
    done: jax.Array  # [B] bool: finished or empty; such slots do not advance


@flax.struct.dataclass
class StepResult:
    """Outputs of one decode step, one entry per slot."""

    tokens: jax.Array  # [B] int32
    logprobs: jax.Array  # [B] f32 behaviour log-prob (the distribution sampled from)
    policy_logprobs: jax.Array  # [B] f32 log-prob at temperature 1, no truncation
    valid: jax.Array  # [B] bool: the slot was running, so this token is real
    done: jax.Array  # [B] bool: the slot is finished after this step


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
    cache = jax.tree.map(
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


def _generate(graphdef, params, state, **draw_kw):
    """One decode step for every slot: feed `tokens` at `positions`, draw the next token."""
    logits, cache = apply(graphdef, params, state.tokens[:, None], state.positions[:, None],
                          state.cache)
    tokens, logprobs, policy_logprobs, finished = _draw(
        logits[:, 0], state.trajectory_ids, state.num_generated, state.positions + 1,
        state.max_new_tokens, **draw_kw)
    running = ~state.done
    done = state.done | (running & finished)
    state = state.replace(
        cache=cache,
        tokens=jnp.where(running, tokens, state.tokens),
        positions=jnp.where(running, state.positions + 1, state.positions),
        num_generated=jnp.where(running, state.num_generated + 1, state.num_generated),
        done=done)
    return state, StepResult(tokens, logprobs, policy_logprobs, running, done)


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
    """

    def __init__(self, graphdef: nnx.GraphDef, config: ModelConfig, *, num_slots: int,
                 max_len: int, prompt_buckets: Sequence[int] = (64, 128, 256),
                 sampling: SamplingParams = SamplingParams(),
                 stop_tokens: Sequence[int] | None = None, max_new_tokens: int | None = None,
                 seed: int = 0, mesh: Mesh | None = None, rules: ShardingRules | None = None,
                 cache_dtype=None):
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

        draw_kw = dict(seed=seed, sampling=sampling, stop_tokens=self.stop_tokens, max_len=max_len)
        new_row = functools.partial(KVCache.init, config, 1, max_len, self.cache_dtype)
        self._input_sharding = None
        pinned = {}  # function name -> output shardings, pinned only when there is a mesh
        if mesh is not None:
            rules = rules or ShardingRules.replicated()
            self._input_sharding = NamedSharding(mesh, PartitionSpec())
            abstract = jax.eval_shape(self._empty_state)
            state = jax.tree.map(lambda _: self._input_sharding, abstract).replace(
                cache=shardings_for(abstract.cache, mesh, rules))
            row = shardings_for(jax.eval_shape(new_row), mesh, rules)
            # Pinned on outputs, so a donated state keeps its layout step after step.
            pinned = {"new_state": state, "new_row": row, "prefill_chunk": (row, None),
                      "insert": state, "generate": (state, None)}

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
        self._generate = jit("generate", functools.partial(_generate, graphdef, **draw_kw),
                             donate_argnums=(1,))

        self._slots: list[Trajectory | None] = [None] * num_slots
        # (tokens, logprobs, policy_logprobs, valid, done) on device, owners, version.
        self._pending: collections.deque = collections.deque()

    def _empty_state(self) -> DecodeState:
        b = self.num_slots
        return DecodeState(
            cache=KVCache.init(self.config, b, self.max_len, self.cache_dtype),
            tokens=jnp.zeros((b,), jnp.int32), positions=jnp.zeros((b,), jnp.int32),
            trajectory_ids=jnp.zeros((b,), jnp.uint32), num_generated=jnp.zeros((b,), jnp.int32),
            max_new_tokens=jnp.zeros((b,), jnp.int32), done=jnp.ones((b,), bool))

    # -- device-side API (JetStream's) ----------------------------------------------------------

    def init_decode_state(self) -> DecodeState:
        """All slots empty. Host records are reset too: one engine drives one decode state."""
        self._slots = [None] * self.num_slots
        self._pending.clear()
        return self._new_state()

    def prefill(self, params, prompt, *, trajectory_id: int | Sequence[int], version: int,
                max_new_tokens: int | None = None) -> tuple[Prefix, jax.Array]:
        """Prefills one prompt and draws a first token per trajectory id.

        trajectory_id: one id, or G ids for a GRPO group sharing this prompt (< 2**32 each).
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
        budget = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if budget < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not ids or len(set(ids)) != len(ids) or not all(0 <= i < 2**32 for i in ids):
            # A repeated id would repeat its random stream: the group would hold copies.
            raise ValueError(f"trajectory_id must be distinct ints in [0, 2**32), got {ids}")
        records = tuple(Trajectory(int(i), prompt, budget) for i in ids)
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
        decode_state = self._insert(
            decode_state, prefix.cache, put(np.asarray(slots, np.int32)), prefix.tokens,
            put(np.int32(prefix.length)), prefix.trajectory_ids, put(np.int32(token_index)),
            prefix.max_new_tokens, prefix.done)
        prefix.inserted = True
        for s, record in zip(slots, prefix.records):
            self._slots[s] = record
        self._pending.append(((prefix.tokens, prefix.logprobs, prefix.policy_logprobs, None,
                               prefix.done), prefix.records, prefix.version))
        return decode_state

    def generate(self, params, decode_state: DecodeState, *,
                 version: int) -> tuple[DecodeState, StepResult]:
        """One decode step with `params`; its tokens are tagged `version` (donates decode_state)."""
        decode_state, result = self._generate(params, decode_state)
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
                self._slots[s] = None
        return done

    def extract(self, slot: int) -> Trajectory:
        """Removes the trajectory in `slot`, running (then partial) or finished, and returns it."""
        self._sync()
        record = self._slots[slot]
        if record is None:
            raise ValueError(f"slot {slot} is empty")
        self._slots[slot] = None
        return record

    def free(self, slot: int) -> None:
        """Drops whatever `slot` holds (an aborted trajectory): host-only, see module docstring."""
        self._slots[slot] = None

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
            for i, record in enumerate(owners):
                # Owners are a snapshot from dispatch time: a slot freed or refilled since then
                # still credits the trajectory that was in it.
                if record is None or record.finished or (valid is not None and not valid[i]):
                    continue
                token = int(tokens[i])
                record.tokens.append(token)
                record.logprobs.append(float(logprobs[i]))
                record.policy_logprobs.append(float(policy_logprobs[i]))
                record.versions.append(version)
                if done[i]:
                    record.finish_reason = "stop" if token in stops else "length"


