#!/usr/bin/env bash
# Builds the GPU tests and benchmarks with --config=cuda and copies them, with
# every shared library they load apart from the C and C++ runtimes (Bazel's
# per-target libraries, libcudart, libzmq, ...), into an ignored folder, so
# that a machine with a GPU but no Bazel can run them:
#
#   tools/gpu_bundle.sh [OUT_DIR] [EXTRA_TARGET...]      # OUT_DIR: gpu_bundle
#   gpu_bundle/run_tests.sh                # every bundled *_test, one line each
#   gpu_bundle/run.sh compression_kernel_bench --quick    # any bundled binary
#
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
  //bench:compression_kernel_bench
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
chmod +x "$out/run.sh" "$out/run_tests.sh"
du -sh "$out"
