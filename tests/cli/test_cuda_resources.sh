#!/usr/bin/env bash
# The resources of every CUDA kernel in this build's libsnug.a, without a GPU: the table of
# tests/cuda_emu/kernel_resources.sh (registers, stack frame, spill bytes, static shared memory per arch and kernel)
# made again and held against the committed tests/cuda_emu/kernel_resources.tsv. Fails, one line per kernel and arch,
# when a kernel's stack frame or spills grow past its baseline row (or a kernel new to the baseline has any), its
# static shared memory passes 48 KiB, its registers leave no room for a 256-thread block, or for the block of its
# __launch_bounds__ (the bound read from the binary, for every kernel the source declares one on); and when the table
# differs from the baseline in anything else (registers, kernels added or removed), with the diff and the command
# that writes the new baseline, so that a change is a reviewed one. Before that it runs the same checks on a doctored
# table that each must catch. Skipped (exit 77) in a build without the CUDA backend (the sanitizer build) and where
# there is no cuobjdump (pip install nvidia-cuda-cuobjdump; tests/cuda_emu/RESOURCES.md).
. "$(dirname "$0")/lib.sh"
BUILD=$(dirname "$SNUG")
LIB=$BUILD/libsnug.a
GEN=$SRC/tests/cuda_emu/kernel_resources.sh
BASE=$SRC/tests/cuda_emu/kernel_resources.tsv

[ -f "$LIB" ] || skip "no $LIB"
ar t "$LIB" | grep -q '\.cu\.o$' || skip "no CUDA objects in $LIB (a build without the CUDA backend)"
CUOBJDUMP=$("$GEN" --which) || skip "no cuobjdump (pip install nvidia-cuda-cuobjdump, or set CUOBJDUMP)"
export CUOBJDUMP
# the PTX is assembled again by the ptxas that built this library
nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2> /dev/null)
if [ -n "$nvcc" ] && [ -x "$(dirname "$nvcc")/ptxas" ]; then export PTXAS; PTXAS=$(dirname "$nvcc")/ptxas; fi

if ! "$GEN" "$LIB" > "$W/now.tsv" 2> "$W/gen.err"; then
  cat "$W/gen.err"; fatal "kernel_resources.sh $LIB"
fi
sed 's/^/  /' "$W/gen.err" # warnings: a ptxas that disagrees with the cubin, an arch without PTX

# bounds.txt: arch, mangled name and the maximum threads per block that __launch_bounds__ put in the cubin
"$CUOBJDUMP" -elf "$LIB" 2> /dev/null | awk -v OFS='\t' '
  function hex(s,  n, i) { n = 0; s = tolower(substr(s, 3))
    for (i = 1; i <= length(s); i++) n = n * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
    return n }
  /^arch = / { arch = $3 }
  /^\.nv\.info\./ { fn = substr($1, 10) }
  /EIATTR_MAX_THREADS/ { want = 1; next }
  want && /Value:/ { print arch, fn, hex($2) * hex($3) * hex($4); want = 0 }' | sort -u > "$W/bounds.txt"
# declared.txt: the kernels whose source declares __launch_bounds__ (the name may stand on the next line)
grep -rh -A1 --include='*.cu' --include='*.cuh' '__launch_bounds__' "$SRC/src" | tr '\n' ' ' |
  grep -oE '__launch_bounds__\(([^()]|\([^()]*\))*\)[[:space:]]*[A-Za-z_][A-Za-z0-9_]*' |
  sed -E 's/.*[^A-Za-z0-9_]//' | sort -u > "$W/declared.txt"

# problems NOW BASE: one line per kernel and arch over a limit or grown past BASE, for the archs BASE has
problems() {
  awk -F'\t' '
    function alloc(r) { return int((r * 32 + 255) / 256) * 256 } # registers a warp is given
    FILENAME == ARGV[1] { bound[$1 SUBSEP $2] = $3; next }
    FILENAME == ARGV[2] { declared[$1] = 1; next }
    FILENAME == ARGV[3] { if (FNR > 1) { bst[$1 SUBSEP $2] = $4; blo[$1 SUBSEP $2] = $5; barch[$1] = 1 } next }
    FNR == 1 { next }
    {
      a = $1; k = $2; regs = $3 + 0; st = $4 + 0; lo = $5 + 0; sm = $6 + 0; key = a SUBSEP k; at = a " " k ":"
      if (a in barch) {
        if (key in bst) {
          if (st > bst[key]) print at, "stack frame", st, "bytes, baseline", bst[key]
          if (lo > blo[key]) print at, "spills", lo, "bytes, baseline", blo[key]
        } else if (st > 0 || lo > 0) print at, "not in the baseline, with", st, "bytes of stack frame and", lo, "of spills"
      }
      if (sm > 49152) print at, sm, "bytes of static shared memory, over the 49152 a block may have"
      if (8 * alloc(regs) > 65536) print at, regs, "registers: a 256-thread block needs", 8 * alloc(regs), "of 65536"
      name = k; sub(/<.*/, "", name)
      if (name in declared) {
        if (!((a SUBSEP $7) in bound)) print at, "declares __launch_bounds__ but its cubin has no maximum threads"
        else if (int((bound[a, $7] + 31) / 32) * alloc(regs) > 65536)
          print at, regs, "registers do not fit its __launch_bounds__ of", bound[a, $7], "threads"
      }
    }' "$W/bounds.txt" "$W/declared.txt" "$2" "$1"
}

# The self-check: a copy of this table with a grown stack frame, grown spills, a kernel new to the baseline with a
# stack frame, 48 KiB + 1 of shared memory, 264 registers, and registers past a declared bound must each be caught
# against the table itself.
rows=$(($(wc -l < "$W/now.tsv") - 1))
if [ "$rows" -lt 5 ]; then bad "only $rows kernels in $LIB"; else
  # the kernel with the largest declared bound, below the rows doctored for the other cases
  big=$(awk -F'\t' 'NR == FNR { b[$1 SUBSEP $2] = $3; next }
    FNR > 5 && (($1 SUBSEP $7) in b) { print FNR, b[$1, $7] }' "$W/bounds.txt" "$W/now.tsv" | sort -k2,2n | tail -1)
  awk -F'\t' -v OFS='\t' -v bl="${big% *}" -v bt="${big#* }" '
    FNR == 2 { $4 += 8 } FNR == 3 { $5 += 4 } FNR == 4 { $6 = 49153 } FNR == 5 { $3 = 264 }
    bl != "" && FNR == bl + 0 { $3 = int(65536 / bt) + 8 }
    { print } END { print "sm_00", "selfcheck_kernel<1>", 32, 16, 0, 0, "_Z16selfcheck_kernelILi1EEvv" }' \
    "$W/now.tsv" > "$W/doctored.tsv"
  { cat "$W/now.tsv"; printf 'sm_00\tnone\t0\t0\t0\t0\tnone\n'; } > "$W/self.base" # the invented arch is known
  problems "$W/doctored.tsv" "$W/self.base" > "$W/self.out"
  missed=0
  for want in "2:stack frame" "3:spills" "4:static shared memory" "5:a 256-thread block" \
               "${big:+${big% *}:__launch_bounds__}"; do
    [ -n "$want" ] || continue
    at=$(awk -F'\t' -v n="${want%%:*}" 'FNR == n { print $1 " " $2 ":" }' "$W/doctored.tsv")
    grep -F -- "$at" "$W/self.out" | grep -qF -- "${want#*:}" ||
      { bad "self-check: a doctored row ($at ${want#*:}) was not caught"; missed=1; }
  done
  grep -qF "sm_00 selfcheck_kernel<1>: not in the baseline" "$W/self.out" ||
    { bad "self-check: a new kernel with a stack frame was not caught"; missed=1; }
  [ -n "$big" ] || echo "  (no kernel with __launch_bounds__ in this build: that part of the self-check skipped)"
  [ $missed -eq 0 ] && ok
fi

# The real checks against the committed baseline
counts=$(tail -n +2 "$W/now.tsv" | cut -f1 | sort | uniq -c | awk '{ printf "%s%s %d kernels", (NR > 1 ? ", " : ""), $2, $1 }')
awk -F'\t' -v counts="$counts" '
  FNR > 1 && $3 + 0 > top { top = $3 + 0; topk = $1 " " $2 }
  FNR > 1 && $4 + $5 > 0 { sl = sl (sl ? ", " : " ") $1 " " $2 " " $4 "/" $5 }
  END { printf "test_cuda_resources: %s; most registers %d (%s); stack/spill bytes:%s\n", counts, top, topk, sl ? sl : " none" }' \
  "$W/now.tsv"
if [ ! -f "$BASE" ]; then
  bad "no baseline $BASE"
else
  problems "$W/now.tsv" "$BASE" > "$W/problems"
  if [ -s "$W/problems" ]; then
    while IFS= read -r line; do bad "$line"; done < "$W/problems"
  else ok; fi
  # the archs this build has and the baseline too; an arch the baseline lacks is held to the limits only
  cut -f1 "$W/now.tsv" | sort -u > "$W/archs.now"
  cut -f1 "$BASE" | sort -u > "$W/archs.base"
  for a in $(comm -23 "$W/archs.now" "$W/archs.base"); do echo "  $a: not in the baseline, held to the limits only"; done
  awk -F'\t' 'NR == FNR { keep[$1] = 1; next } $1 in keep' "$W/archs.base" "$W/now.tsv" > "$W/now.cmp"
  awk -F'\t' 'NR == FNR { keep[$1] = 1; next } $1 in keep' "$W/archs.now" "$BASE" > "$W/base.cmp"
  if diff -u --label "$BASE" --label "this build" "$W/base.cmp" "$W/now.cmp" > "$W/diff"; then ok; else
    bad "the kernels' resources differ from the baseline (a change to review):"
    cat "$W/diff"
    echo "  if the change is meant, write the new baseline and commit it with the change:"
    echo "    CUOBJDUMP=$CUOBJDUMP ${PTXAS:+PTXAS=$PTXAS }$GEN $LIB > $BASE"
  fi
fi

finish
