"""libFuzzer targets compiled by clang++ (14, or the newest found: Debian
13 has 19) through a genrule.

Bazel's C++ toolchain here is gcc, which has no libFuzzer, so a fuzzer is
built the way cuda.bzl builds .cu files: one genrule that calls the compiler
on every source it needs (the code under test is compiled with coverage
instrumentation too), with ASan and UBSan, any UB fatal.
"""

CLANG = "$$(ls /usr/bin/clang++-14 /usr/bin/clang++-[0-9][0-9] 2>/dev/null | head -n 1)"
FUZZ_FLAGS = " ".join([
    "-std=c++17",
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=fuzzer,address,undefined",
    "-fno-sanitize-recover=all",
    "-Wall",
    "-Wextra",
    "-Werror",
])

def clang_fuzzer(name, srcs, hdrs = [], linkopts = [], visibility = None, testonly = False):
    """A libFuzzer binary `name` built from the .cc files in `srcs`.

    `hdrs` are the headers they include (generated ones are found through
    $(GENDIR)); `linkopts` name system libraries ("-lflatbuffers").
    """
    cc_srcs = [s for s in srcs if s.endswith(".cc")]
    native.genrule(
        name = name,
        srcs = srcs + hdrs,
        outs = [name + ".bin"],
        cmd = "%s %s -I. -Iinclude -I$(GENDIR) %s -o $@ %s" % (
            CLANG,
            FUZZ_FLAGS,
            " ".join(["$(location %s)" % s for s in cc_srcs]),
            " ".join(linkopts),
        ),
        executable = True,
        testonly = testonly,
        visibility = visibility,
    )

def fuzz_test(name, fuzzer, args = [], data = []):
    """Runs libFuzzer target `fuzzer` for a bounded time (fuzz_test.sh) as
    the sh_test `name`; `args` follow the fuzzer's path (fuzz_test.sh: a
    seed maker or "-", then libFuzzer flags), `data` what they name. Exclusive: a fuzzer keeps the cores busy for its
    whole run, so it runs alone and the timing bounds of the multi-process
    tests beside it hold."""
    native.sh_test(
        name = name,
        size = "medium",
        srcs = ["fuzz_test.sh"],
        tags = ["exclusive"],
        args = ["$(location %s)" % fuzzer] + args,
        data = [fuzzer] + data,
    )
