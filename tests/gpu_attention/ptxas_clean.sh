#!/usr/bin/env bash
# ptxas_clean.sh — the Hopper flash kernels compile the way their speed depends on, checked on the
# CPU (ctest hk_flash_ptxas_clean_test): each sm_90a instantiation unit of kernels/flash-attn is
# compiled again with `ptxas -v`, and the test fails on any C75xx performance finding — wgmma
# serialised (C7510-C7520), setmaxnreg ignored (C7507) — in any kernel, or on a spill in the
# backward's dK/dV kernels. ptxas prints these as `info` lines and builds the code anyway, so
# without this a change that makes ptxas fall back (a wait with a trap inside a setmaxnreg
# region, a register split it cannot honour) builds, passes every correctness test and is only
# seen as a slower kernel on the GPU. Not here: the forward's spills (v5 keeps 4 bytes outside its
# loop), run-time behaviour.
# Usage: ptxas_clean.sh NVCC SOURCE_DIR
set -euo pipefail
nvcc=${1:?usage: ptxas_clean.sh NVCC SOURCE_DIR}
src=${2:?usage: ptxas_clean.sh NVCC SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for unit in "$src"/kernels/flash-attn/src/flash_attn/inst/sm90_*.cu; do
  name=$(basename "$unit" .cu)
  log=$work/$name.log
  if ! "$nvcc" -DHK_FLASH_HAVE_SM90A=1 -I"$src/kernels/flash-attn/src" -I"$src/include" -O3 \
    -lineinfo --generate-code=arch=compute_90a,code=[sm_90a] --expt-relaxed-constexpr \
    -std=c++17 -Xptxas=-v -c "$unit" -o "$work/$name.o" >"$log" 2>&1; then
    echo "FAIL $name: does not compile"; cat "$log"; status=1; continue
  fi
  if grep -q 'C75[0-9][0-9]' "$log"; then
    echo "FAIL $name: ptxas performance findings:"
    grep -o 'C75[0-9][0-9].*' "$log" | cut -c1-200 | sort | uniq -c
    status=1
  fi
  # the backward kernels' "Function properties" lines, then their spill line
  spills=$(grep -A1 'Function properties for .*flash_bwd_dkdv_sm90_kernel' "$log" |
    grep -E '[1-9][0-9]* bytes spill (stores|loads)' || true)
  if [ -n "$spills" ]; then
    echo "FAIL $name: the backward dK/dV kernel spills:"; echo "$spills"; status=1
  fi
  if [ $status -eq 0 ]; then
    echo "$name: $(grep -c 'Compiling entry function' "$log") kernels, no C75xx finding, backward without spills"
  fi
done
exit $status
