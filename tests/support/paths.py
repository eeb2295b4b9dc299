"""Where the tests find the project: its root, the programs tests run, the benchmarks, the configs."""
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
WORKERS = os.path.join(TESTS, "workers")
BENCHMARKS = os.path.join(ROOT, "benchmarks")
CONFIGS = os.path.join(ROOT, "configs")
FIXTURES = os.path.join(TESTS, "fixtures")


def python_path(*dirs: str) -> str:
    """PYTHONPATH for a child process: DIRS first, then whatever this process was given (on the GPU
    machine the project and its carried packages are found only through it)."""
    return os.pathsep.join(p for p in (*dirs, os.environ.get("PYTHONPATH", "")) if p)
