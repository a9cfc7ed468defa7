#!/usr/bin/env bash
# Installs the Debian packages snug builds against, when any is missing, and prepares the default job's data.
set -euo pipefail
cd "$(dirname "$0")/.."

# libdnnl-dev (oneDNN 2.x) is optional: it gives bf16 runs the bf16 GEMMs of CPUs with AMX or AVX512-BF16;
# Open MPI runs data-parallel training over several processes (mpirun -np N snug train ...)
pkgs=(build-essential cmake pkg-config libyaml-dev libjansson-dev libpcre2-dev libutf8proc-dev libopenblas0-openmp
      libdnnl-dev fortunes fortunes-min python3 python3-venv libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The default job's corpus: every fortune from Debian's fortunes packages, one JSON object per line.
if [ ! -s data/fortunes.jsonl ]; then
  python3 scripts/fortunes_to_jsonl.py /usr/share/games/fortunes data/fortunes.jsonl
fi
