#!/usr/bin/env bash
# Makes (once) the virtual environment the parity tests and benchmarks use as their reference: PyTorch (CPU),
# transformers, safetensors, tokenizers, bitsandbytes (its 8-bit optimizer maps and 4-bit quantization; imports
# without a GPU), peft (LoRA adapters), tensorboard (the reader of TensorBoard's event files) and llama-cpp-python
# with gguf (the readers of GGUF exports), and llama.cpp's converter from the same llama-cpp-python's source
# distribution with sentencepiece (the reference the GGUF exports are compared with). Prints its path.
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
# llama.cpp's own converter (convert_hf_to_gguf.py, its conversion/ package and gguf-py), from the source
# distribution of the same llama-cpp-python: test_gguf_parity compares snug's GGUF files with the converter's (it
# skips that comparison without it). Kept in $venv/share/llama.cpp-convert; nothing is downloaded at test time.
conv="$venv/share/llama.cpp-convert"
if [ ! -f "$conv/convert_hf_to_gguf.py" ] && "$venv/bin/python" -c "import llama_cpp" >/dev/null 2>&1; then
  ver=$("$venv/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)")
  echo "venv: keeping llama.cpp's converter from llama-cpp-python $ver's source distribution in $conv" >&2
  tmp=$(mktemp -d)
  if "$venv/bin/pip" download -q --no-binary :all: --no-deps "llama-cpp-python==$ver" -d "$tmp" >&2 &&
     tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp" --wildcards '*/vendor/llama.cpp/convert_hf_to_gguf.py' \
       '*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/gguf-py/*'; then
    mkdir -p "$conv"
    cp -r "$tmp"/llama_cpp_python-*/vendor/llama.cpp/{convert_hf_to_gguf.py,conversion,gguf-py} "$conv/"
  else
    echo "venv: llama.cpp's converter could not be kept: test_gguf_parity will not compare with it" >&2
  fi
  rm -rf "$tmp"
fi
# sentencepiece, which the converter imports for every Llama (it reads tokenizer.model with it where there is one)
if [ -f "$conv/convert_hf_to_gguf.py" ] && ! "$venv/bin/python" -c "import sentencepiece" >/dev/null 2>&1; then
  echo "venv: installing sentencepiece (llama.cpp's converter imports it) into $venv" >&2
  "$venv/bin/pip" install -q sentencepiece >&2 ||
    echo "venv: sentencepiece did not install: test_gguf_parity will not compare with the converter" >&2
fi
echo "$venv"
