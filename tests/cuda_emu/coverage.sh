#!/usr/bin/env bash
# coverage.sh TABLE COVERAGE: every kernel the real build compiles (the sm_90 rows of TABLE, tests/cuda_emu/
# kernel_resources.tsv) must have been launched on the emulated CUDA runtime by the tests that ran before (the names
# each process appended to COVERAGE). Prints the count and the kernels never launched; exit 1 if there are any.
set -u
table=$1 cov=$2
if [ ! -s "$cov" ]; then
  echo "cuda_emu_coverage: no kernel ran on the emulated runtime ($cov is empty or missing)"; exit 1
fi
all=$(awk -F'\t' '$1 == "sm_90" { print $2 }' "$table" | sort -u)
ran=$(sort -u "$cov")
total=$(printf '%s\n' "$all" | grep -c .)
missing=$(comm -23 <(printf '%s\n' "$all") <(printf '%s\n' "$ran"))
unknown=$(comm -13 <(printf '%s\n' "$all") <(printf '%s\n' "$ran"))
nmiss=$(printf '%s' "$missing" | grep -c .)
echo "cuda_emu_coverage: $((total - nmiss)) of $total kernels launched on the emulated CUDA runtime"
if [ -n "$unknown" ]; then
  echo "  launched but not in the table (regenerate it: tests/cuda_emu/RESOURCES.md):"
  printf '    %s\n' $unknown
fi
if [ "$nmiss" -gt 0 ]; then
  echo "  never launched:"
  printf '    %s\n' $missing
  exit 1
fi
