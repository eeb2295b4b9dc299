"""Builds only the native extension fastckpt._native; metadata lives in setup.cfg.

libpmem2 is used for the pmem store when its header is found at build time
(FASTCKPT_NO_LIBPMEM2=1 builds without it); otherwise the core's own persistence path runs.
"""
import glob
import os

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup


def has_libpmem2() -> bool:
    if os.environ.get("FASTCKPT_NO_LIBPMEM2"):
        return False
    return any(os.path.exists(os.path.join(d, "libpmem2.h")) for d in ("/usr/include", "/usr/local/include"))


pmem2 = has_libpmem2()
native = Pybind11Extension(
    "fastckpt._native",
    # the core's definitions (native/src) against its headers (native/include/fastckpt)
    sources=sorted(glob.glob("native/src/*.cc")),
    include_dirs=["native/include"],
    depends=sorted(glob.glob("native/include/fastckpt/*.h")),  # a header edit rebuilds the extension
    libraries=["z", "dl"] + (["pmem2"] if pmem2 else []),
    define_macros=[("FASTCKPT_HAVE_LIBPMEM2", "1")] if pmem2 else [],
    cxx_std=17,
    extra_compile_args=["-O3", "-Wall", "-Wextra"],
)

# the core's sources compiled side by side, one per core (FASTCKPT_BUILD_JOBS=N to say how many);
# every object is rebuilt each time, as a header edit asks
ParallelCompile("FASTCKPT_BUILD_JOBS").install()
setup(ext_modules=[native], cmdclass={"build_ext": build_ext})
