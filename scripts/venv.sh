#!/usr/bin/env bash
# Makes (once) the virtual environment the parity tests and benchmarks use as their reference: PyTorch (CPU),
# transformers, safetensors, tokenizers, bitsandbytes (its 8-bit optimizer maps and 4-bit quantization; imports
# without a GPU), peft (LoRA adapters), tensorboard (the reader of TensorBoard's event files) and llama-cpp-python
# with gguf (the readers of GGUF exports). Prints its path.
set -euo pipefail
venv="${SNUG_VENV:-$HOME/.cache/snug/venv}"
if ! "$venv/bin/python" -c "import torch, transformers, safetensors, tokenizers, numpy, bitsandbytes, peft, tensorboard" >/dev/null 2>&1; then
  echo "venv: installing torch, transformers, safetensors, tokenizers, bitsandbytes, peft, tensorboard into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q torch transformers safetensors tokenizers numpy bitsandbytes peft tensorboard >&2
fi
# cuobjdump, which the CUDA toolkit's pip packages leave out: the check of the kernels' registers and spills
# (tests/cli/test_cuda_resources.sh) reads the built library with it
if ! compgen -G "$venv/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump" >/dev/null; then
  echo "venv: installing nvidia-cuda-cuobjdump into $venv" >&2
  "$venv/bin/pip" install -q nvidia-cuda-cuobjdump >&2 ||
    echo "venv: nvidia-cuda-cuobjdump did not install: the kernel resource check will be skipped" >&2
fi
# llama.cpp's Python binding (it compiles llama.cpp: minutes) and the gguf reader: test_gguf_parity loads the files
# `snug export --gguf` writes with them (it skips without them)
if ! "$venv/bin/python" -c "import llama_cpp, gguf" >/dev/null 2>&1; then
  echo "venv: installing llama-cpp-python (compiles llama.cpp) and gguf into $venv" >&2
  CMAKE_ARGS="-DGGML_NATIVE=OFF" "$venv/bin/pip" install -q llama-cpp-python gguf >&2 ||
    echo "venv: llama-cpp-python did not install: test_gguf_parity will be skipped" >&2
fi
echo "$venv"
