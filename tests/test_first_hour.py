"""What a new user meets in the first hour: the Makefile's commands keep working after `make
clean`, and every Python block of the README runs as written (tests/readme_blocks.py)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_clean_forgets_the_install_stamp_with_the_extension():
    """`make clean` removed fastckpt/*.so but kept .venv/.installed, so the next `make demo`
    found nothing to do and failed with `cannot import name '_native'`."""
    said = subprocess.run(["make", "-n", "clean"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "fastckpt/*.so" in said and ".venv/.installed" in said


def _readme_sections():
    import readme_blocks
    with open(os.path.join(ROOT, "README.md")) as f:
        return readme_blocks.sections(f.read())


@pytest.mark.parametrize("section", sorted(_readme_sections()))
def test_every_python_block_of_the_readme_runs(section, tmp_path):
    import socket
    import sys

    import readme_blocks
    code = _readme_sections()[section]
    if "deepspeed" in code:
        pytest.importorskip("deepspeed")
    (tmp_path / "block.py").write_text(readme_blocks.script(code))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a single process, as the README says a plain `python script.py` of the DeepSpeed block needs
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "block.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"the README's {section!r} code fails as written:\n{r.stderr[-4000:]}"


def test_loading_one_part_of_a_saved_state_into_a_model(tmp_path):
    """The README saves {"model", "opt", "step"}; loading into model.state_dict() said 'from a
    different model?'. It now says to pick a part, and key= picks it."""
    import torch

    import fastckpt
    from fastckpt.errors import StateMismatchError
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with fastckpt.Checkpointer(str(tmp_path / "ck")) as ck:
        ck.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": 3}, step=3).wait()
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model.weight.zero_()
        with pytest.raises(StateMismatchError, match="key='model'"):
            ck.load(into=model.state_dict())
        ck.load(into=model.state_dict(), key="model")
        assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
        assert ck.load(key="step") == 3
        with pytest.raises(StateMismatchError, match=r"has no part 'weights' \(it has: \['model', 'opt', 'step'\]\)"):
            ck.load(key="weights")


def test_activation_offload_makes_its_folder(tmp_path):
    from fastckpt.offload import ActivationOffload
    ActivationOffload(str(tmp_path / "ssd" / "tmp"))
    assert (tmp_path / "ssd" / "tmp").is_dir()
