#!/usr/bin/env bash
# check-bare-build.sh: proves that snug builds and runs from deps/ alone, as scripts/gpu-check.sh does on a bare GPU
# machine. Needs root (a private mount namespace, `unshare -m`) and the packages from scripts/fetch-deps.sh.
#   1. unpacks deps/debs into deps/root (scripts/unpack_debs.py, no dpkg);
#   2. with the system's headers (oneDNN's among them: deps/ does not carry it, so its path is not compiled), .pc
#      files, pkg-config and OpenBLAS hidden (bind mounts seen by this script only), configures with
#      -DSNUG_DEPS_ROOT and builds snug and test_blas (CPU-only, for speed);
#   3. with the system's runtime copies of those libraries hidden as well, runs test_blas and a short training run,
#      and lists which files the binaries loaded: every one from deps/root. (libpcre2-8 is hidden last: mount itself
#      needs it, as does grep, so nothing in that namespace uses either afterwards.)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
[ "$(id -u)" -eq 0 ] || { echo "check-bare-build: needs root (unshare -m)" >&2; exit 2; }
ls deps/debs/*.deb >/dev/null 2>&1 || { echo "check-bare-build: run scripts/fetch-deps.sh first" >&2; exit 2; }
rm -rf deps/root
python3 scripts/unpack_debs.py deps/debs deps/root
B=${BARE_BUILD:-$(mktemp -d /tmp/snug-bare.XXXXXX)}
MA=$(gcc -print-multiarch)
L=/usr/lib/$MA

hide_dev='
  for h in yaml.h jansson.h jansson_config.h pcre2.h pcre2posix.h utf8proc.h; do
    [ -e /usr/include/$h ] && mount --bind /dev/null /usr/include/$h; done
  for d in '$L'/pkgconfig /usr/share/pkgconfig '$L'/openblas-openmp '$L'/openblas-pthread \
           /usr/include/'$MA'/openblas-openmp /usr/include/'$MA'/openblas-pthread /usr/include/oneapi; do
    [ -d $d ] && mount -t tmpfs none $d; done
  for t in /usr/bin/pkg-config /usr/bin/pkgconf /usr/bin/'$MA'-pkg-config; do
    [ -e $t ] && mount --bind /dev/null $t; done
  true'
hide_run='
  for f in '$L'/libyaml-0.so.2 '$L'/libjansson.so.4 '$L'/libutf8proc.so.2 '$L'/libgfortran.so.5 \
           '$L'/libquadmath.so.0 '$L'/libopenblas.so.0 '$L'/libblas.so.3 '$L'/libpcre2-8.so.0; do
    [ -e $f ] && mount --bind /dev/null "$(readlink -f $f)"; done
  true'

echo "== configure and build with the system's -dev files hidden"
unshare -m bash -c "set -e; $hide_dev
  ! command -v pkg-config >/dev/null || ! pkg-config --exists yaml-0.1 2>/dev/null
  cmake -S '$ROOT' -B '$B' -DSNUG_DEPS_ROOT='$ROOT/deps/root' -DSNUG_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >'$B.configure.log'
  cmake --build '$B' -j\$(nproc) --target snug test_blas >'$B.build.log'"
grep -E "Dependencies from|OpenBLAS|oneDNN" "$B.configure.log"

echo "== run with the system's runtime copies hidden too"
unshare -m bash -c "set -e; $hide_dev; $hide_run
  cd '$B'
  ./test_blas
  printf '{\"text\": \"a line of text to train on, repeated for a few steps.\"}\n%.0s' \$(seq 100) > data.jsonl
  ./snug train --dataset data.jsonl --tokenizer '$ROOT/assets/tokenizer' --model_preset tiny-llama --sequence_len 32 \
    --micro_batch_size 2 --max_steps 3 --sample_tokens 0 --val_set_size 0 --output_dir out > train.log
  ./snug train --dataset data.jsonl --tokenizer '$ROOT/assets/tokenizer' --model_preset tiny-llama --sequence_len 32 \
    --micro_batch_size 2 --max_steps 100000 --sample_tokens 0 --val_set_size 0 --output_dir out2 > train2.log &
  pid=\$!
  for i in \$(seq 100); do [[ \$(<train2.log) == *\$'\\n'step* ]] && break; sleep 0.1; done
  cat /proc/\$pid/maps > maps.txt; kill \$pid; wait \$pid || true"
grep -E '^  gemm|^step' "$B/train.log"
echo "== libraries the running snug had mapped"
awk '{print $6}' "$B/maps.txt" | sort -u | grep -E "yaml|jansson|pcre2|utf8proc|blas|gfortran|quadmath" | tee "$B/libs.txt"
if grep -qv "^$ROOT/deps/root/" "$B/libs.txt" || [ "$(wc -l < "$B/libs.txt")" -lt 7 ]; then
  echo "check-bare-build: FAILED: a library came from outside deps/root"; exit 1
fi
echo "check-bare-build: ok (build in $B)"
