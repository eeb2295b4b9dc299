"""Builds only the native extension fastckpt._native; metadata lives in setup.cfg."""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

native = Pybind11Extension(
    "fastckpt._native",
    sources=["native/bindings.cc", "native/write_job.cc"],
    include_dirs=["native"],
    libraries=["z", "dl"],
    cxx_std=17,
    extra_compile_args=["-O3", "-Wall", "-Wextra"],
)

setup(ext_modules=[native], cmdclass={"build_ext": build_ext})
