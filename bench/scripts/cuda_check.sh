#!/usr/bin/env bash
# The CUDA backend on the GPU machine, in one call: build (Release, VQ_CUDA),
# the whole ctest suite, test_cuda, compute-sanitizer memcheck and racecheck
# of test_cuda on small shapes, then bench_cuda. Logs go to $OUT (default
# ./cuda_check_out); a short summary is printed last.
#   bench/scripts/cuda_check.sh [--no-bench] [--quick-bench] [--no-ctest] [--bench-only=SPEC]
set -u
OUT=${OUT:-$PWD/cuda_check_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-cuda}
JOBS=${JOBS:-16}
bench=1
bench_args=()
ctest=1
for a in "$@"; do
  case $a in
    --no-bench) bench=0 ;;
    --no-ctest) ctest=0 ;;
    --quick-bench) bench_args+=(--quick) ;;
    --bench-only=*) bench_args+=("${a#--bench-only=}") ;;
  esac
done
summary=()
step() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-12s rc=%-3d %4ds' "$name" "$rc" $((SECONDS - t0)))")
  return $rc
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/gpu.txt" 2>&1
step configure cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DVQ_CUDA=ON || { cat "$OUT/configure.log"; exit 1; }
step build cmake --build "$BUILD" -j"$JOBS" || { tail -50 "$OUT/build.log"; exit 1; }
[ $ctest = 1 ] && step ctest ctest --test-dir "$BUILD" --output-on-failure -j8
step test_cuda "$BUILD/tests/test_cuda"
if command -v compute-sanitizer >/dev/null; then
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/test_cuda" --small
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/test_cuda" --small
fi
if [ $bench = 1 ]; then
  step bench "$BUILD/bench_cuda" "${bench_args[@]}"
fi
[ -f "$OUT/ctest.log" ] && echo "== ctest" && grep -E "tests passed|Failed|\*\*\*|Skipped" "$OUT/ctest.log" | tail -8
echo "== test_cuda"; tail -30 "$OUT/test_cuda.log"
for t in memcheck racecheck; do
  [ -f "$OUT/$t.log" ] && { echo "== $t"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/$t.log" | tail -4; }
done
[ -f "$OUT/bench.log" ] && { echo "== bench"; cat "$OUT/bench.log"; }
echo "== steps"; printf '%s\n' "${summary[@]}"
