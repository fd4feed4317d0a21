"""CUDA sources compiled by nvcc through a genrule, behind --config=cuda."""

NVCC = "/usr/local/cuda/bin/nvcc"

# Machine code for every GPU generation CUDA 13 builds for (Turing to
# Blackwell; a cubin also runs on later minor versions of its major, e.g.
# sm_80 on sm_87, sm_100 on sm_103), and PTX of the newest for GPUs after
# it, compiled by the driver on first use.
CUDA_ARCHS = ["75", "80", "86", "89", "90", "100", "110", "120"]
PTX_ARCH = "120"

NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
] + ["-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHS] + [
    "-gencode arch=compute_%s,code=compute_%s" % (PTX_ARCH, PTX_ARCH),
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
    """A cc_library whose .cu `srcs` are compiled by nvcc (CUDA_ARCHS and PTX).

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
