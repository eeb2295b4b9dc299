"""The public API is typed: mypy, with the settings of setup.cfg's [mypy] section, finds every
function of the public modules it lists annotated and no type error in them (their imports are
followed silently). The list covers `fastckpt`'s and `fastckpt.dcp`'s exported modules and the
modules of the plugins' public classes; a public module missing from it fails here too."""
from __future__ import annotations

import configparser
import os
import subprocess
import sys

from support.paths import ROOT

# every module a user's import reaches for a public name (fastckpt.__all__, fastckpt.dcp.__all__,
# and each plugin's __all__), relative to the repository
PUBLIC = {
    "fastckpt/__init__.py", "fastckpt/errors.py", "fastckpt/checkpointer.py", "fastckpt/commit_info.py",
    "fastckpt/pending.py", "fastckpt/reproducibility.py", "fastckpt/save_load.py",
    "fastckpt/dcp/__init__.py", "fastckpt/dcp/writer.py", "fastckpt/dcp/reader.py", "fastckpt/dcp/stager.py",
    "fastckpt/dcp/committed.py", "fastckpt/dcp/groups.py", "fastckpt/dcp/preempt.py", "fastckpt/dcp/saved_paths.py",
    "fastckpt/dcp/metadata.py", "fastckpt/dcp/on_s3.py", "fastckpt/session.py",
    "lightning_fastckpt/__init__.py", "lightning_fastckpt/checkpoint_io.py", "lightning_fastckpt/model_parallel.py",
    "lightning_fastckpt/layerwise.py", "lightning_fastckpt/preempt.py", "lightning_fastckpt/offload.py",
    "lightning_fastckpt/tuned_checkpoint.py",
    "deepspeed_fastckpt/__init__.py", "deepspeed_fastckpt/engine.py", "deepspeed_fastckpt/interval.py",
    "deepspeed_fastckpt/offload.py", "deepspeed_fastckpt/preempt.py",
    "torchtitan_fastckpt/__init__.py", "torchtitan_fastckpt/manager.py",
}


def checked_files() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    return {f.strip() for f in cfg["mypy"]["files"].replace("\n", " ").split(",") if f.strip()}


def test_mypy_checks_every_public_module():
    assert checked_files() == PUBLIC
    for package in ("fastckpt", "fastckpt.dcp", "lightning_fastckpt", "deepspeed_fastckpt", "torchtitan_fastckpt"):
        init = os.path.join(ROOT, *package.split("."), "__init__.py")
        assert os.path.relpath(init, ROOT) in PUBLIC, package


def test_the_public_modules_are_annotated_and_type_check():
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", os.devnull], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert f"Success: no issues found in {len(PUBLIC)} source files" in proc.stdout, proc.stdout[-2000:]
