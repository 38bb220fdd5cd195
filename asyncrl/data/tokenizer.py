"""A character tokenizer for the tiny experiments, built with the `tokenizers` library.

The tiny model learns arithmetic from scratch, so its vocabulary is only what the task
writes: digits, operators and three special tokens. A real `tokenizers.Tokenizer`, so the
tiny runs go through the same encode / decode / save code as a Hugging Face checkpoint.
"""

from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

SPECIAL = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2: ModelConfig.tiny()'s bos and eos
CHARACTERS = "0123456789+-*%()=? "


def char_tokenizer() -> tokenizers.Tokenizer:
    vocab = {token: i for i, token in enumerate((*SPECIAL, *CHARACTERS))}
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL))
    return tokenizer
