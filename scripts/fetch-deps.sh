#!/usr/bin/env bash
# fetch-deps.sh: downloads the Debian packages snug builds and runs against (headers, libraries, OpenBLAS and its
# Fortran runtime) into deps/debs (ignored by git), for a machine that has neither them nor a network, such as a bare
# GPU machine with only the CUDA toolkit, CMake, a C compiler and Python. Run it where Debian's packages can be
# fetched; carry deps/ with the tree; scripts/gpu-check.sh unpacks them into deps/root and builds against that
# folder (cmake -DSNUG_DEPS_ROOT=deps/root) when the system lacks the libraries. oneDNN (libdnnl-dev, whose library
# is 40 MB and pulls in OpenCL) is left out: the build then compiles without the CPU's bf16 GEMM path, which a GPU
# machine's runs do not use.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libyaml-0-2 libyaml-dev libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev
      libopenblas0-openmp libgfortran5 libquadmath0)
command -v apt-get >/dev/null || { echo "fetch-deps: needs apt-get (a Debian or Ubuntu machine)" >&2; exit 2; }
mkdir -p deps/debs
cd deps/debs
rm -f ./*.deb
if ! apt-get download "${pkgs[@]}" >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  apt-get download "${pkgs[@]}" >/dev/null
fi
ls -1 ./*.deb | sed 's|^\./|fetch-deps: |'
echo "fetch-deps: $(du -sh . | cut -f1) in deps/debs"
