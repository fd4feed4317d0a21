"""The sources //docs:settings_doc_test reads for the settings they take."""

def setting_sources(extra = []):
    """A filegroup `setting_sources`: the package's C++ sources (and `extra`
    globs), test files left out, visible to //docs."""
    native.filegroup(
        name = "setting_sources",
        srcs = native.glob(["*.cc", "*.h"] + extra, exclude = ["*_test.*"]),
        visibility = ["//docs:__pkg__"],
    )
