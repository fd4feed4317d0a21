"""CUDA sources compiled by nvcc through a genrule, behind --config=cuda."""

NVCC = "/usr/local/cuda/bin/nvcc"
NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
    "-Xcompiler -fPIC,-Wall,-Wextra",
    "-Werror all-warnings",
])

def cuda_only():
    """target_compatible_with value: only built with --config=cuda."""
    return select({
        "//build_defs:cuda_enabled": [],
        "//conditions:default": ["//build_defs:unavailable"],
    })

def cuda_library(name, srcs, hdrs = [], cu_deps = [], deps = [], visibility = None):
    """A cc_library whose .cu `srcs` are compiled by nvcc (sm_90 and PTX).

    `cu_deps` are headers the .cu files include; `deps` are linked in.
    """
    objs = []
    for src in srcs:
        obj = "_cuda_objs/%s/%s" % (name, src.replace(".cu", ".pic.o"))
        native.genrule(
            name = "%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + cu_deps,
            outs = [obj],
            # nvcc's temporary files get a directory of their own: parallel
            # sandboxed nvcc processes share a pid and would collide in /tmp.
            cmd = ("TMP=$$(mktemp -d $(@D)/nvcc_tmp.XXXXXX) && " +
                   "TMPDIR=$$TMP %s %s -I. -I$(GENDIR) -c $(location %s) -o $@; " +
                   "rc=$$?; rm -rf $$TMP; exit $$rc") % (NVCC, NVCC_FLAGS, src),
            target_compatible_with = cuda_only(),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        target_compatible_with = cuda_only(),
        visibility = visibility,
    )
