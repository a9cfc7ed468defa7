#!/usr/bin/env bash
# Makes (once) the virtual environment the parity tests and benchmarks use as their reference: PyTorch (CPU),
# transformers, safetensors, tokenizers, bitsandbytes (its 8-bit optimizer maps and 4-bit quantization; imports
# without a GPU), peft (LoRA adapters) and tensorboard (the reader of TensorBoard's event files). Prints its path.
set -euo pipefail
venv="${SNUG_VENV:-$HOME/.cache/snug/venv}"
if ! "$venv/bin/python" -c "import torch, transformers, safetensors, tokenizers, numpy, bitsandbytes, peft, tensorboard" >/dev/null 2>&1; then
  echo "venv: installing torch, transformers, safetensors, tokenizers, bitsandbytes, peft, tensorboard into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q torch transformers safetensors tokenizers numpy bitsandbytes peft tensorboard >&2
fi
echo "$venv"
