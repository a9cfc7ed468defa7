#!/usr/bin/env bash
# The resources of every compiled CUDA kernel instantiation, read from the fatbins of built objects or static
# libraries (the build's libsnug.a): one TSV row per (arch, kernel), sorted, under the header
#   arch  kernel  regs  stack  local  smem  mangled
# arch: sm_80, sm_90...; kernel: the demangled name with its template arguments, without return type, parameters,
# spaces or anonymous/internal namespace (att_fwd_tiled<2,64>); regs: registers per thread; stack: the stack frame in
# bytes per thread; local: bytes of spill stores + spill loads (0: no spill); smem: static shared memory per block in
# bytes as ptxas reports it (the 1 KiB that sm_90 binaries reserve on top is not in it); mangled: the symbol.
# tests/cuda_emu/kernel_resources.tsv is this table for the default build; tests/cli/test_cuda_resources.sh checks a
# build against it and the CUDA emulator reads it. See tests/cuda_emu/RESOURCES.md.
#
# Nothing is compiled again from source. regs and stack are the shipped cubin's (`cuobjdump -res-usage`); ptxas
# records spills nowhere in the binary, so the PTX that the fatbin carries for each arch is assembled again by the
# build's own ptxas with the options stored beside it (`ptxas -v`), which gives the same registers (checked, a warning
# when not) plus the spill bytes and the static shared memory. An arch shipped without its PTX falls back to the cubin
# alone: local is then its stack frame (spills live there) and smem the cubin's shared size, with a warning.
#
# usage: kernel_resources.sh FILE.a|FILE.o...   (the table on stdout)
#        kernel_resources.sh --which             (the cuobjdump it uses; exit 1 when there is none)
# CUOBJDUMP and PTXAS name the tools when they are not found on PATH, in the toolkit, or (cuobjdump, which the
# toolkit's pip packages leave out) in Python's site-packages as nvidia-cuda-cuobjdump installs it.
set -euo pipefail

find_cuobjdump() {
  local c d
  for c in "${CUOBJDUMP:-}" "$(command -v cuobjdump || true)" "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  for c in "${SNUG_VENV:-/nonexistent}"/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump; do
    [ -x "$c" ] && { echo "$c"; return 0; }
  done
  command -v python3 > /dev/null || return 1
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))'); do
    for c in "$d"/nvidia/cu*/bin/cuobjdump "$d"/nvidia/cuda_cuobjdump/bin/cuobjdump; do
      [ -x "$c" ] && { echo "$c"; return 0; }
    done
  done
  return 1
}

find_ptxas() {
  local c
  for c in "${PTXAS:-}" "$(command -v ptxas || true)" "$(dirname "$(command -v nvcc || echo .)")/ptxas" \
           "${CUDA_HOME:-/usr/local/cuda}/bin/ptxas"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

if [ "${1:-}" = --which ]; then find_cuobjdump; exit; fi
if [ $# -eq 0 ] || [ "${1#-}" != "$1" ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
CUOBJDUMP=$(find_cuobjdump) || { echo "kernel_resources: no cuobjdump (pip install nvidia-cuda-cuobjdump)" >&2; exit 3; }
PTXAS=$(find_ptxas) || { echo "kernel_resources: no ptxas (the CUDA toolkit's)" >&2; exit 3; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

# cubin.txt: arch mangled regs stack smem (the shipped binaries); ptxas.txt: arch mangled regs stack spill smem
: > "$W/cubin.txt"
: > "$W/ptxas.txt"
i=0
for f in "$@"; do
  [ -r "$f" ] || { echo "kernel_resources: cannot read $f" >&2; exit 2; }
  f=$(realpath "$f")
  "$CUOBJDUMP" -res-usage "$f" 2> /dev/null | awk '
    /^Fatbin elf code/ { elf = 1 } /^Fatbin ptx code/ { elf = 0 }
    elf && /^arch = / { arch = $3 }
    elf && /^ Function / { name = $2; sub(/:$/, "", name) }
    elf && /REG:/ {
      for (k = 1; k <= NF; k++) { split($k, kv, ":"); v[kv[1]] = kv[2] }
      print arch, name, v["REG"], v["STACK"] + v["LOCAL"], v["SHARED"]
    }' >> "$W/cubin.txt" || true
  i=$((i + 1))
  mkdir "$W/$i"
  # "Extracting PTX file and ptxas options    1: libsnug.1.sm_80.ptx -arch=sm_80 ..."
  (cd "$W/$i" || exit 1; "$CUOBJDUMP" -xptx all "$f" 2> /dev/null || true) | sed -n 's/^Extracting PTX file and ptxas options *[0-9]*: //p' |
  while read -r ptx opts; do
    # shellcheck disable=SC2086 # the stored options are words
    "$PTXAS" $opts -v "$W/$i/$ptx" -o "$W/$i/$ptx.cubin" 2>&1 | awk '
      /Compiling entry function/ { split($0, q, "'\''"); cur = q[2]; arch = q[4]; st = sp = 0 }
      /Function properties for / { props = $NF }
      /bytes stack frame/ && props == cur { st = $1; sp = $5 + $9 }
      /Used [0-9]+ registers/ && cur != "" {
        regs = $0; sub(/.*Used /, "", regs); sub(/ .*/, "", regs)
        smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH) + 0
        print arch, cur, regs, st, sp, smem; cur = ""
      }' >> "$W/ptxas.txt"
  done
done
[ -s "$W/cubin.txt" ] || { echo "kernel_resources: no CUDA kernels in $*" >&2; exit 4; }

cut -d' ' -f2 "$W/cubin.txt" | sort -u > "$W/mangled.txt"
c++filt -p < "$W/mangled.txt" > "$W/demangled.txt"
[ "$(wc -l < "$W/mangled.txt")" -eq "$(wc -l < "$W/demangled.txt")" ] || { echo "kernel_resources: c++filt" >&2; exit 5; }

printf 'arch\tkernel\tregs\tstack\tlocal\tsmem\tmangled\n'
awk -v OFS='\t' '
  FILENAME == ARGV[1] { mangled[FNR] = $0; next }
  FILENAME == ARGV[2] {
    k = $0; gsub(/ /, "", k); sub(/^void/, "", k)
    gsub(/\(anonymousnamespace\)::/, "", k); gsub(/_INTERNAL[A-Za-z0-9_]*::/, "", k)
    name[mangled[FNR]] = k; next
  }
  FILENAME == ARGV[3] { p[$1, $2] = $3 " " $4 " " $5 " " $6; next }
  {
    key = $1 SUBSEP $2
    if (seen[key]++) next # one instantiation linked from several objects
    if (key in p) {
      split(p[key], q, " ")
      if (q[1] != $3 || q[2] != $4)
        printf "kernel_resources: %s %s: ptxas gives %s registers, %s stack, the cubin %s, %s (another ptxas?)\n",
          $1, name[$2], q[1], q[2], $3, $4 > "/dev/stderr"
      local = q[3]; smem = q[4]
    } else {
      printf "kernel_resources: %s %s: no PTX for this arch; local and smem from the cubin\n", $1, name[$2] > "/dev/stderr"
      local = $4; smem = $5
    }
    print $1, name[$2], $3, $4, local, smem, $2
  }' "$W/mangled.txt" "$W/demangled.txt" "$W/ptxas.txt" "$W/cubin.txt" | LC_ALL=C sort -t"$(printf '\t')" -k1,1 -k2,2 -k7,7
