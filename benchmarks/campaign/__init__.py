"""The reliability campaign (issue 7): each module is one part, `run(...) -> dict` of counts.

benchmarks/reliability.py runs the parts (CI-sized, or --many) and prints and records their
figures; tests/benchmarks/test_reliability.py runs the same script CI-sized and checks them. Parts that
kill or crash run their victims as forked children of a process that imported torch and
fastckpt but never ran a thread, so a kill costs milliseconds instead of an interpreter start.
"""
