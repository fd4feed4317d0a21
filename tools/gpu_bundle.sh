#!/usr/bin/env bash
# Builds the GPU tests of kernels/ and the kernel benchmark with
# --config=cuda and copies them, with every shared library they load from
# outside the system directories (Bazel's per-target libraries, libcudart),
# into an ignored folder, so that a machine with a GPU but no Bazel can run
# them:
#
#   tools/gpu_bundle.sh [OUT_DIR] [EXTRA_TARGET...]      # OUT_DIR: gpu_bundle
#   LD_LIBRARY_PATH=gpu_bundle/lib gpu_bundle/bin/compress_kernels_test
#   LD_LIBRARY_PATH=gpu_bundle/lib gpu_bundle/bin/compression_kernel_bench --quick
#
# gpu_bundle/run_tests.sh runs every bundled test and reports each result.
# Libraries larger than 32 MiB (NCCL) are left out: the GPU machine must
# provide those itself.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-gpu_bundle}
shift || true
targets=(
  //kernels:compress_kernels_test
  //kernels:reduce_cuda_test
  //bench:compression_kernel_bench
  "$@"
)
max_lib_bytes=$((32 << 20))

bazel build --config=cuda "${targets[@]}"
bin=$(bazel info --config=cuda bazel-bin)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for target in "${targets[@]}"; do
  pkg=${target#//}
  pkg=${pkg%%:*}
  name=${target##*:}
  cp "$bin/$pkg/$name" "$out/bin/$name"
  ldd "$bin/$pkg/$name" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
    while read -r lib; do
      case "$lib" in
        /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) continue ;;
      esac
      if [ "$(stat -L -c %s "$lib")" -gt "$max_lib_bytes" ]; then
        echo "left out (too large): $lib" >&2
        continue
      fi
      cp -L "$lib" "$out/lib/"
    done
done

cat >"$out/run_tests.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every bundled test binary; exit status 1 if any failed.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
for t in bin/*_test; do
  if "$t" "$@"; then
    echo "PASSED $(basename "$t")"
  else
    echo "FAILED $(basename "$t")"
    status=1
  fi
done
exit $status
RUN
chmod +x "$out/run_tests.sh"
du -sh "$out"
