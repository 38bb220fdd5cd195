"""The attention implementations `config.train.attention` may name (asyncrl/model/attention.py
runs them). Import-light: the config check reads the names without loading JAX.

  auto       splash on TPU, flash_gpu on GPU, blockwise elsewhere (chosen at trace time)
  dense      the [T, S] score matrix in XLA: the reference
  blockwise  online softmax over key blocks in XLA, recomputed per block in the backward pass
  splash     Pallas splash attention (TPU)
  flash_gpu  Pallas flash attention (GPU)
  cudnn      cuDNN's fused attention (GPU; rows holding one trajectory each, no segment ids)
"""

ATTENTION_IMPLS = ("auto", "dense", "blockwise", "splash", "flash_gpu", "cudnn")
