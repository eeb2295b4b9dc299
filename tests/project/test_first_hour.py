"""What a new user meets in the first hour: the Makefile's commands keep working after `make
clean`, and every Python block of the README runs as written (tests/support/readme_blocks.py)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from support.paths import ROOT, python_path


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_clean_forgets_the_install_stamp_with_the_extension():
    """`make clean` removed fastckpt/*.so but kept .venv/.installed, so the next `make demo`
    found nothing to do and failed with `cannot import name '_native'`."""
    said = subprocess.run(["make", "-n", "clean"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "fastckpt/*.so" in said and ".venv/.installed" in said


def _readme_sections():
    from support import readme_blocks
    with open(os.path.join(ROOT, "README.md")) as f:
        return readme_blocks.sections(f.read())


@pytest.mark.parametrize("section", sorted(_readme_sections()))
def test_every_python_block_of_the_readme_runs(section, tmp_path):
    import socket
    import sys

    from support import readme_blocks
    code = _readme_sections()[section]
    if "deepspeed" in code:
        pytest.importorskip("deepspeed")
    (tmp_path / "block.py").write_text(readme_blocks.script(code))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a single process, as the README says a plain `python script.py` of the DeepSpeed block needs
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=python_path(ROOT))
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


DEMO_SMALL = ["demo.steps=40", "demo.every=5", "demo.kill_at=23", "demo.d_model=32", "demo.layers=1",
              "demo.vocab=64", "demo.seq=16", "demo.heads=2"]


@pytest.mark.parametrize("store", ["root", "pmem"])
def test_the_demo_resumes_exactly_says_where_things_went_and_leaves_little(tmp_path, store):
    """The main job, small: the checkpoint it resumed from is the state the killed run saved and
    the resumed run ends bit-exact (and the exit status says so), figures as medians
    with quartiles over the same steps, and the torch.save reference files gone — also with the
    pool elsewhere (they went next to it: /dev/shm/torch_save)."""
    import sys
    run_dir = tmp_path / "run"
    extra = [f"store=pmem", f"root={tmp_path / 'pools' / 'demo.pool'}"] if store == "pmem" else []
    (tmp_path / "pools").mkdir()
    r = subprocess.run([sys.executable, "-m", "fastckpt.demo", *DEMO_SMALL, *extra, f"hydra.run.dir={run_dir}"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    # which checkpoint had committed when the kill came is timing (a loaded machine may still be
    # writing step 20 at step 23): whichever it was, it is the one resumed from and equals the state saved
    resumed = re.search(r"resumed from step (\d+)", r.stdout)
    assert resumed and int(resumed[1]) in (5, 10, 15, 20), r.stdout
    assert re.search(rf"^checkpoint at step {resumed[1]} equals the state saved: YES$", r.stdout, re.M), r.stdout
    assert "resumed model bit-identical to the uninterrupted run: YES" in r.stdout
    assert "quartiles" in r.stdout and re.search(r"^steps \d+-40, median", r.stdout, re.M), r.stdout
    assert "torch.save reference files were removed" in r.stdout
    assert not (run_dir / "torch_save").exists() and os.listdir(tmp_path / "pools") == (["demo.pool"] if extra else [])


# README passages that name CUDA or a GPU without claiming a GPU path of ours works: install
# advice, what to save for an exact resume, Lightning's own rule, how to run the GPU tests and benchmark
GPU_ADVICE = ("Both create `.venv`", "1. **Everything the next step reads", "`ModelCheckpoint` then saves each",
              "On a GPU, `make bench-gpu`", "GPU-only tests carry")


def readme_passages(readme: str) -> list[str]:
    """The README's prose cut into passages (a paragraph, or one bullet or numbered item of a list),
    code blocks left out, whitespace folded."""
    out = []
    for para in re.split(r"\n\s*\n", re.sub(r"```.*?```", "", readme, flags=re.S)):
        cur: list[str] = []
        for line in para.splitlines():
            if re.match(r"\s*(?:[-*]|\d+\.) ", line) and cur:
                out.append(" ".join(" ".join(cur).split()))
                cur = []
            cur.append(line)
        if cur:
            out.append(" ".join(" ".join(cur).split()))
    return out


def test_the_readme_says_tested_on_gpu_only_once_a_gpu_run_is_recorded():
    """Every README passage about a CUDA path of ours says "not yet run on a GPU" until a GPU run is
    recorded in benchmarks/RESULTS.md; a "tested on GPU on DATE" names a day RESULTS.md recorded."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    results = open(os.path.join(ROOT, "benchmarks", "RESULTS.md")).read()
    recorded = "<!-- gpu_overhead:begin -->" in results
    claims = re.findall(r"tested on GPU on (\d{4}-\d{2}-\d{2})", readme)
    gpu = re.compile(r"\bCUDA\b|\bGPUs?\b|NCCL|kvikio|\bGDS\b|cudaHostRegister")
    about_gpu = [p for p in readme_passages(readme) if gpu.search(p) and not p.startswith(GPU_ADVICE)]
    assert len(about_gpu) >= 6, about_gpu  # the strategies, waits, staging, layer-wise, pool, kvikio passages
    if not recorded:
        assert not claims, claims
        for p in about_gpu:
            assert "not yet run on a GPU" in p, f"a GPU passage without its mark: {p[:200]}"
    for day in claims:
        assert day in results, f"the README says tested on GPU on {day}; RESULTS.md has no run of that day"
