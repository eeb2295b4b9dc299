"""Where the tests find the project: its root, the programs tests run, the benchmarks, the configs."""
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
WORKERS = os.path.join(TESTS, "workers")
BENCHMARKS = os.path.join(ROOT, "benchmarks")
CONFIGS = os.path.join(ROOT, "configs")
FIXTURES = os.path.join(TESTS, "fixtures")
