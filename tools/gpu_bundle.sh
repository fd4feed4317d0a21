#!/usr/bin/env bash
# Builds the GPU tests and benchmarks with --config=cuda and copies them, with
# every shared library they load apart from the C and C++ runtimes (Bazel's
# per-target libraries, libcudart, libzmq, ...), into an ignored folder, so
# that a machine with a GPU but no Bazel can run them:
#
#   tools/gpu_bundle.sh [OUT_DIR] [EXTRA_TARGET...]      # OUT_DIR: gpu_bundle
#   gpu_bundle/run_tests.sh                # every bundled *_test, one line each
#   gpu_bundle/run.sh compression_kernel_bench --quick    # any bundled binary
#   gpu_bundle/run_all.sh [LOG_DIR]        # tests, PyTorch GPU tests, GPU
#                                          # benches, CPU scaling, the rest
#
# run_all.sh runs from a checkout of the same commit holding the bundle (the
# PyTorch parts use its python/, bench/ and tests/); the PyTorch parts need
# a python3 whose torch has CUDA (GRADSYNC_PYTHON names another) and the
# Fashion-MNIST files (the PyTorch GPU test trains on them):
# GRADSYNC_FASHION_MNIST, or OUT_DIR/fashion-mnist, which GPU_BUNDLE_DATA=1
# copies in from Debian's dataset-fashion-mnist. The bundle is about 90 MiB
# with the data, 50 MiB as a .tar.gz.
# The binaries and libraries are stripped.
# Binaries keep their workspace paths under OUT_DIR/gradsync/ and the tests
# run with TEST_SRCDIR=OUT_DIR, so multi-process tests find the binaries they
# start (tests/local_job.h). Libraries larger than 32 MiB (NCCL) are left
# out: run.sh looks for the GPU machine's own NCCL (/usr/local/cuda, or the
# one Python's nvidia-nccl wheel installed).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-gpu_bundle}
shift || true
targets=(
  //kernels:compress_kernels_test
  //kernels:reduce_cuda_test
  //client:nccl_comm_test
  //client:nccl_collectives_test
  //tests:device_gradients_test
  //tests:device_worker
  //server:gradsync_server
  //python:libgradsync.so
  //bench:compression_kernel_bench
  //bench:device_pipeline_bench
  //bench:allreduce_bench
  //bench:ps_bench
  //bench:lanes_worker
  //wire:gradsync_keygen
  "$@"
)
max_lib_bytes=$((32 << 20))

bazel build --config=cuda "${targets[@]}"
bin=$(bazel info --config=cuda bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/lib"
for target in "${targets[@]}"; do
  pkg=${target#//}
  pkg=${pkg%%:*}
  name=${target##*:}
  mkdir -p "$out/gradsync/$pkg"
  cp -L "$bin/$pkg/$name" "$out/gradsync/$pkg/$name"
  [ -f "$bin/$pkg/$name.so" ] && cp -L "$bin/$pkg/$name.so" "$out/gradsync/$pkg/"
  ldd "$bin/$pkg/$name" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
    while read -r soname lib; do
      case "$soname" in
        # The C and C++ runtimes come from the machine that runs the bundle.
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | \
        libresolv.so* | libgcc_s.so* | libstdc++.so* | ld-linux*) continue ;;
      esac
      [ -e "$out/lib/$soname" ] && continue
      if [ "$(stat -L -c %s "$lib")" -gt "$max_lib_bytes" ]; then
        echo "left out (too large): $lib" >&2
        continue
      fi
      cp -L "$lib" "$out/lib/$soname"
    done
done

# ring_lanes_bench runs from the bundle's tree as from bazel-bin.
mkdir -p "$out/gradsync/tools"
cp bench/ring_lanes_bench.sh bench/sim_job.sh "$out/gradsync/bench/"
cp tools/simhosts.sh "$out/gradsync/tools/"

cat >"$out/env.sh" <<'ENV'
# Sourced by run.sh and run_tests.sh: the bundle's libraries, then NCCL.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
nccl=""
for d in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu \
    $(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2>/dev/null) \
    $(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) + "/nvidia/nccl/lib")' 2>/dev/null); do
  if [ -e "$d/libnccl.so.2" ]; then nccl=$d; break; fi
done
export LD_LIBRARY_PATH="$here/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_SRCDIR="$here"
export TEST_TMPDIR="${TEST_TMPDIR:-$(mktemp -d)}"
ENV

cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# run.sh NAME [ARGS...]: runs the bundled binary NAME.
source "$(dirname "$0")/env.sh"
name=$1
shift
exec "$(ls "$here"/gradsync/*/"$name")" "$@"
RUN

cat >"$out/run_tests.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every bundled test binary; exit status 1 if any failed.
source "$(dirname "$0")/env.sh"
status=0
for t in "$here"/gradsync/*/*_test; do
  if "$t" "$@"; then
    echo "PASSED $(basename "$t")"
  else
    echo "FAILED $(basename "$t")"
    status=1
  fi
done
exit $status
RUN
cat >"$out/run_all.sh" <<'RUN'
#!/usr/bin/env bash
# run_all.sh [LOG_DIR]: the bundle's tests, the GPU benchmarks, the PyTorch
# GPU bench and tests, and the CPU scaling benchmarks, each under a time
# limit; one line per part, logs in LOG_DIR. Exit status 1 if a part failed.
# RUN_ALL_BUDGET_S: parts that would start later than this many seconds in
# are skipped (said on their line), so that a lease's time goes to the
# first parts.
source "$(dirname "$0")/env.sh"
logs=${1:-$(mktemp -d)}
mkdir -p "$logs"
root=$(cd "$here/.." && pwd)
status=0
budget=${RUN_ALL_BUDGET_S:-100000}
part() {  # NAME LIMIT_S CMD...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  if [ "$SECONDS" -ge "$budget" ]; then
    echo "$name: skipped (past RUN_ALL_BUDGET_S=$budget)"
    return 0
  fi
  [ $((SECONDS + limit)) -le "$budget" ] || limit=$((budget - SECONDS))
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for t in "$here"/gradsync/*/*_test; do
  part "$(basename "$t")" 300 "$t" --gtest_brief=1
done
python=${GRADSYNC_PYTHON:-python3}
if "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  torch_ok=1
else
  torch_ok=0
  echo "PyTorch parts: skipped ($python has no torch with CUDA; set GRADSYNC_PYTHON)"
fi
torch_part() {  # NAME LIMIT_S ARGS...: a part run by $python from the checkout
  [ "$torch_ok" = 1 ] || return 0
  local data=${GRADSYNC_FASHION_MNIST:-$here/fashion-mnist}
  [ -d "$data" ] || data=/usr/share/datasets/fashion-mnist
  (
    cd "$root"
    export GRADSYNC_LIBRARY=$here/gradsync/python/libgradsync.so GRADSYNC_PYTHON=$python
    export GRADSYNC_FASHION_MNIST=$data PYTHONPATH=$root/python:$root/tests/torch
    export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
    part "$1" "$2" "$python" "${@:3}"
    exit $status
  ) || status=1
}
# In order of what matters most when the lease is short: correctness on the
# GPU, the GPU figures, the 16-core scaling, then the rest.
torch_part torch_cuda_test 400 -m pytest -q -rs -p no:cacheprovider tests/torch/torch_cuda_test.py
part device_pipeline_bench 120 "$here/run.sh" device_pipeline_bench --reps=20
part compression_kernel_bench 120 "$here/run.sh" compression_kernel_bench --quick
part ps_bench 300 "$here/run.sh" ps_bench --quick --workers=8 --shards=1,2,4 \
  --server_bin="$here/gradsync/server/gradsync_server"
part allreduce_bench 300 "$here/run.sh" allreduce_bench --quick --ranks=8 \
  --impls=gradsync_ring,gloo_ring,gradsync_ring_shm,gradsync_shm_segments,gradsync_ring_sealed
torch_part torch_gpu_bench 300 bench/torch_gpu_bench.py --reps=1 --steps=60
# The sealed ring (Noise KK, AES-256-GCM) against the plain one.
part allreduce_sealed 300 "$here/run.sh" allreduce_bench --ranks=8 \
  --sizes=1M,4M,16M --impls=gradsync_ring,gradsync_ring_sealed
# Lanes on simulated 10 Gbit/s hosts, no per-flow cap: whether more lanes
# pay where the cores are not the limit.
if "$here/gradsync/tools/simhosts.sh" check 2>/dev/null; then
  part ring_lanes_bench 300 "$here/gradsync/bench/ring_lanes_bench.sh" 10gbit "" "1 2 4" both
  part ps_lanes_bench 300 "$here/gradsync/bench/ring_lanes_bench.sh" 10gbit "" "1 2 4" none \
    67108864 ps
else
  echo "ring_lanes_bench: skipped (no network namespaces here)"
fi
echo "logs: $logs"
exit $status
RUN
chmod +x "$out/run.sh" "$out/run_tests.sh" "$out/run_all.sh"
strip --strip-unneeded "$out"/gradsync/*/* "$out"/lib/* 2>/dev/null || true
if [ "${GPU_BUNDLE_DATA:-0}" = 1 ]; then
  cp -r /usr/share/datasets/fashion-mnist "$out/fashion-mnist"
fi
du -sh "$out"
