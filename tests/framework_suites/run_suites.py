"""Runs Lightning's or DeepSpeed's own checkpoint tests twice — stock, then with fastckpt as the
default — and reports which failures are fastckpt's. Not part of CI: it needs a checkout of the
framework's repository (at, or near, the installed version); their tests stay in that checkout.

    python tests/framework_suites/run_suites.py lightning --checkout DIR [--tests PATH ...]
    python tests/framework_suites/run_suites.py deepspeed --checkout DIR [--tests PATH ...]
        [--timeout S] [--out report.json] [--only fastckpt] [--python PATH]

--python runs the suite with another interpreter (one with the framework at the checkout's
version, e.g. a venv with deepspeed==0.19.5 for a v0.19.5 checkout): the tests of one release
against the code of another fail for reasons of their own. fastckpt comes from this tree
(PYTHONPATH), native extension included, so that interpreter must be the same Python version.

Lightning: `-p lightning_default_io` (this folder on PYTHONPATH) makes FastCheckpointIO the
CheckpointIO every strategy builds by default. DeepSpeed: `deepspeed_hook/sitecustomize.py`
(on PYTHONPATH, so every worker process DeepSpeed's harness starts imports it) adds a
`"fastckpt": {}` entry to every DeepSpeed config. DeepSpeed runs on its CPU accelerator (gloo) with 2 ranks (LOCAL_SIZE=2: the accelerator's
device count; tests that need more skip).
A run that outlives --timeout (or that DeepSpeed's harness ends with "Test hanged") is a HANG,
naming the test it was in.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIGHTNING_TESTS = [
    "tests_pytorch/checkpointing", "tests_pytorch/callbacks/test_model_checkpoint_additional_cases.py",
    "tests_pytorch/callbacks/test_model_checkpoint_edge_cases.py",
    "tests_pytorch/callbacks/test_model_checkpoint_manual_opt.py",
    "tests_pytorch/callbacks/test_model_checkpoint_step_interval_val_metric.py", "tests_pytorch/core/test_saving.py",
    "tests_pytorch/models/test_restore.py", "tests_pytorch/plugins/test_checkpoint_io_plugin.py",
    "tests_pytorch/plugins/test_async_checkpoint.py", "tests_pytorch/trainer/connectors/test_checkpoint_connector.py",
    "tests_pytorch/trainer/test_trainer.py",
]
DEEPSPEED_TESTS = ["tests/unit/checkpoint"]


def suite(framework: str, checkout: str, tests: list[str] | None, kind: str) -> tuple[list[str], str, dict]:
    """(pytest arguments, working directory, extra environment) of one run: kind is stock or fastckpt."""
    env = {"PYTHONUNBUFFERED": "1"}
    patched = kind != "stock"
    path = [ROOT, os.environ.get("PYTHONPATH", "")]
    if framework == "lightning":
        args = list(tests or LIGHTNING_TESTS) + (["-p", "lightning_default_io"] if patched else [])
        cwd = os.path.join(checkout, "tests")
        path.insert(0, HERE)
    else:
        args = list(tests or DEEPSPEED_TESTS)
        cwd = checkout
        env["DS_ACCELERATOR"] = "cpu"
        env["LOCAL_SIZE"] = "2"
        if patched:
            path.insert(0, os.path.join(HERE, "deepspeed_hook"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return args, cwd, env


def run(framework: str, checkout: str, tests, kind: str, timeout: float, xml: str, python: str) -> dict:
    """Outcome of every test id (passed / failed / skipped) and, when the run hung, where."""
    args, cwd, env = suite(framework, checkout, tests, kind)
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    hung = None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        hung = f"the run outlived {timeout:g} s"
    if "Test hanged, exiting" in out:
        hung = "DeepSpeed's harness: Test hanged"
    results = parse(xml) if os.path.exists(xml) else {}
    if hung:
        last = [line for line in out.splitlines() if "::" in line]
        hung += f" (last test named: {last[-1].split()[0] if last else '?'})"
    return {"results": results, "hung": hung, "seconds": round(time.monotonic() - t0, 1), "tail": out[-4000:]}


def parse(xml: str) -> dict[str, dict]:
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        status, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                status = "skipped" if tag == "skipped" else "failed"
                why = (el.get("message") or el.text or "").strip().splitlines()[0][:300] if (el.get("message") or el.text) else ""
                break
        out[name] = {"status": status, "why": why}
    return out


def compare(stock: dict, ours: dict) -> dict:
    s, o = stock["results"], ours["results"]
    failed = lambda r, k: r.get(k, {}).get("status") == "failed"  # noqa: E731
    ours_only = sorted(k for k in o if failed(o, k) and not failed(s, k))
    both = sorted(k for k in o if failed(o, k) and failed(s, k))
    return {"fastckpt_only": {k: o[k]["why"] for k in ours_only}, "failing_stock_too": both,
            "passed_with_fastckpt": sum(1 for v in o.values() if v["status"] == "passed"),
            "passed_stock": sum(1 for v in s.values() if v["status"] == "passed"),
            "hung": {"stock": stock["hung"], "fastckpt": ours["hung"]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("framework", choices=("lightning", "deepspeed"))
    ap.add_argument("--checkout", required=True, help="the framework's repository checkout")
    ap.add_argument("--tests", nargs="*", default=None, help="test paths inside the checkout (default: its checkpoint tests)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one whole run may take")
    ap.add_argument("--only", choices=("stock", "fastckpt"), default=None, help="one of the two runs")
    ap.add_argument("--out", default=None, help="JSON report")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the suite")
    a = ap.parse_args(argv)
    checkout = os.path.abspath(a.checkout)
    runs = {}
    for kind in ("stock", "fastckpt"):
        if a.only in (None, kind):
            print(f"== {a.framework}, {kind} ...", flush=True)
            runs[kind] = run(a.framework, checkout, a.tests, kind, a.timeout,
                             os.path.join("/tmp", f"{a.framework}-{kind}-{os.getpid()}.xml"), a.python)
            r = runs[kind]
            counts = {}
            for v in r["results"].values():
                counts[v["status"]] = counts.get(v["status"], 0) + 1
            print(f"   {counts} in {r['seconds']} s" + (f"; HANG: {r['hung']}" if r["hung"] else ""), flush=True)
    report = {"framework": a.framework, "checkout": checkout, "runs": {k: {kk: vv for kk, vv in v.items() if kk != "tail"}
                                                                        for k, v in runs.items()}}
    if "stock" in runs and "fastckpt" in runs:
        report["compare"] = c = compare(runs["stock"], runs["fastckpt"])
        print(f"fastckpt-only failures: {len(c['fastckpt_only'])}; failing stock too: {len(c['failing_stock_too'])}; "
              f"passed: {c['passed_stock']} stock, {c['passed_with_fastckpt']} with fastckpt")
        for k, why in c["fastckpt_only"].items():
            print(f"  FASTCKPT-ONLY {k}: {why}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    bad = any(r["hung"] for r in runs.values()) or ("compare" in report and report["compare"]["fastckpt_only"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
