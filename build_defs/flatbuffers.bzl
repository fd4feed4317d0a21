"""flatc as a genrule: C++ headers generated from a .fbs schema."""

def flatbuffer_cc_library(name, src, deps = [], visibility = None):
    """Generates <base>_generated.h from `src` and wraps it in a cc_library."""
    out = src.replace(".fbs", "_generated.h")
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = [out],
        cmd = "flatc --cpp --scoped-enums -o $(@D) $(location %s)" % src,
    )
    native.cc_library(
        name = name,
        hdrs = [out],
        deps = deps + ["@flatbuffers"],
        visibility = visibility,
    )
