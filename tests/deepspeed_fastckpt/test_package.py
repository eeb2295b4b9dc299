"""deepspeed_fastckpt's package: each public name, and each module of it that imports DeepSpeed, works
as a program's first contact with the plugin, DeepSpeed not yet imported (the names load on first
use; the plugin registers with DeepSpeed as DeepSpeed is imported, also halfway through the import
of one of its own modules), and only the ones that need DeepSpeed import it."""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("deepspeed")
import deepspeed_fastckpt  # noqa: E402
from support import warm  # noqa: E402
from support.paths import ROOT, python_path  # noqa: E402

FIRST_CONTACT = """
import importlib
import sys
import deepspeed_fastckpt as plugin
assert "deepspeed" not in sys.modules
if NAME.startswith("."):  # a module of it, imported first
    importlib.import_module(NAME, "deepspeed_fastckpt")
else:
    value = getattr(plugin, NAME)
    assert value is not None and value is getattr(plugin, NAME)
if "deepspeed" in sys.modules:
    from deepspeed.runtime.engine import DeepSpeedEngine
    print("registered", getattr(DeepSpeedEngine._configure_checkpointing, "__fastckpt_wrapped__", False))
else:
    print("no deepspeed")
"""


@pytest.mark.parametrize("name", sorted(deepspeed_fastckpt.__all__))
def test_each_public_name_works_first_and_registers_the_engine_where_it_imports_deepspeed(name):
    """`from deepspeed_fastckpt import at_step_end` before `import deepspeed` once failed in an import
    cycle (the plugin registering halfway through its own engine module's import of DeepSpeed)."""
    out = warm.run([sys.executable, "-c", f"NAME = {name!r}\n" + FIRST_CONTACT], capture_output=True, text=True,
                   timeout=120, env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    needs_deepspeed = name not in ("SETTINGS", "offload_activations", "register")  # register() imports it when called
    assert out.stdout.split("\n")[-2] == ("registered True" if needs_deepspeed else "no deepspeed"), out.stdout


@pytest.mark.parametrize("module", [".engine", ".interval", ".preempt"])
def test_each_module_that_imports_deepspeed_works_first_and_registers_the_engine(module):
    out = warm.run([sys.executable, "-c", f"NAME = {module!r}\n" + FIRST_CONTACT], capture_output=True, text=True,
                   timeout=120, env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "registered True", out.stdout
