"""What a new user meets in the first hour: the README starts with the two commands and stays
short, its links and those of docs/ lead somewhere, the Makefile's commands keep working after
`make clean`, and every Python block of the README and of docs/*.md runs as written
(tests/support/readme_blocks.py)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from support import warm
from support.paths import ROOT, python_path


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_clean_forgets_the_install_stamp_with_the_extension():
    """`make clean` removed fastckpt/*.so but kept .venv/.installed, so the next `make demo`
    found nothing to do and failed with `cannot import name '_native'`."""
    said = subprocess.run(["make", "-n", "clean"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "fastckpt/*.so" in said and ".venv/.installed" in said


README_MAX_CHARS = 12_000  # a README a newcomer reads in five minutes; the rest is in docs/
DOCS_PAGES = ("design", "lightning", "deepspeed", "dcp", "s3", "pmem", "offload", "cli", "tuning")


def _block_sections():
    from support import readme_blocks
    return readme_blocks.all_sections(ROOT)


def test_the_blocks_run_come_from_the_readme_and_from_docs():
    """The collector finds the README's blocks and the docs pages' (a collector that found none
    would leave the test below with nothing to run)."""
    from support import readme_blocks
    names = readme_blocks.documents(ROOT)
    assert names[0] == "README.md" and all(f"docs/{p}.md" in names for p in DOCS_PAGES), names
    files = {section.split(": ", 1)[0] for section in _block_sections()}
    for name in ("README.md", "docs/design.md", "docs/pmem.md", "docs/offload.md"):
        assert name in files, f"no Python block of {name} is run"
    for name in names:  # every ```python block of every file is in one of its sections
        text = open(os.path.join(ROOT, name)).read()
        assert not re.search(r"^```py$", text, flags=re.M), f"{name}: a Python block tagged `py` is not run as written"
        blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)
        ran = "\n".join(code for section, code in _block_sections().items() if section.startswith(name + ": "))
        assert all(b in ran for b in blocks), name


def _run_block(folder):
    """folder/block.py run as one process, as the README says a plain `python script.py` of the
    DeepSpeed block needs (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, a free MASTER_PORT)."""
    import sys

    from support.processes import free_port
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=python_path(ROOT))
    return warm.run([sys.executable, "block.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("section", sorted(_block_sections()))
def test_every_python_block_of_the_readme_and_docs_runs(section, tmp_path, request):
    """Each section's blocks as one process; a section that names an s3:// place runs against
    the test S3 server (bucket `ckpt`), found through the environment as the page says."""
    from support import readme_blocks
    code = _block_sections()[section]
    if "s3://" in code:
        request.getfixturevalue("s3_env")
    if "deepspeed" in code:
        pytest.importorskip("deepspeed")
    if "torchtitan" in code:
        pytest.importorskip("torchtitan")
    (tmp_path / "block.py").write_text(readme_blocks.script(code))
    r = _run_block(tmp_path)
    assert r.returncode == 0, f"the code of {section!r} fails as written:\n{r.stderr[-4000:]}"


def test_the_readme_starts_with_the_demo_and_the_tests_and_stays_short():
    """The README's first block, before any section, is the two commands: `make demo`, then
    `make test` (what CI runs: .ci/run); the whole README fits README_MAX_CHARS and sends the
    reader on to every docs/ page."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    first = re.search(r"^```(\w*)\n(.*?)^```", readme, flags=re.M | re.S)
    assert first and first[1] == "bash" and "\n## " not in readme[:first.start()], readme[:500]
    commands = [line.split("#")[0].strip() for line in first[2].splitlines()]
    assert commands[:2] == ["make demo", "make test"], commands
    assert "make test" in open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
    size = len(readme.encode())  # as `wc -c README.md` counts
    assert size <= README_MAX_CHARS, f"the README has {size} bytes, over {README_MAX_CHARS}"
    for page in DOCS_PAGES:
        assert f"(docs/{page}.md" in readme, f"the README does not link docs/{page}.md"


def _anchors(text: str) -> set[str]:
    """The anchors a Markdown page has: GitHub's slug of every heading, and every `id="..."`."""
    out = set(re.findall(r'id="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6} (.*)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


def test_the_links_of_the_readme_and_docs_lead_somewhere():
    """Every relative link of the README and of docs/*.md names a file of the repository, and its
    `#anchor`, if any, a heading (or an id) of that file."""
    from support import readme_blocks
    broken = []
    for name in readme_blocks.documents(ROOT):
        text = open(os.path.join(ROOT, name)).read()
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", text, flags=re.S)):
            if re.match(r"[a-z]+:", target):
                continue  # http(s)://, mailto:
            path, _, anchor = target.partition("#")
            file = os.path.normpath(os.path.join(ROOT, os.path.dirname(name), path)) if path else \
                os.path.join(ROOT, name)
            if not os.path.exists(file):
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and anchor not in _anchors(open(file).read()):
                broken.append(f"{name}: {target} (no such anchor)")
    assert not broken, broken


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
    extra = ["store=pmem", f"root={tmp_path / 'pools' / 'demo.pool'}"] if store == "pmem" else []
    (tmp_path / "pools").mkdir()
    r = warm.run([sys.executable, "-m", "fastckpt.demo", *DEMO_SMALL, *extra, f"hydra.run.dir={run_dir}"],
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


# passages of the README and docs/ that name CUDA or a GPU without claiming a GPU path of ours works:
# install advice, what to save for an exact resume, Lightning's own rule, how to run the GPU tests and
# benchmark
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
    """Every passage of the README and of docs/*.md about a CUDA path of ours says "not yet run on a
    GPU" until a GPU run is recorded in benchmarks/RESULTS.md; a "tested on GPU on DATE" names a day
    RESULTS.md recorded."""
    from support import readme_blocks
    results = open(os.path.join(ROOT, "benchmarks", "RESULTS.md")).read()
    recorded = "<!-- gpu_overhead:begin -->" in results
    gpu = re.compile(r"\bCUDA\b|\bGPUs?\b|NCCL|kvikio|\bGDS\b|cudaHostRegister")
    claims, about_gpu = [], []
    for name in readme_blocks.documents(ROOT):
        text = open(os.path.join(ROOT, name)).read()
        claims += [(name, day) for day in re.findall(r"tested on GPU on (\d{4}-\d{2}-\d{2})", text)]
        about_gpu += [(name, p) for p in readme_passages(text) if gpu.search(p) and not p.startswith(GPU_ADVICE)]
    # the strategies, waits, staging, layer-wise, pool, kvikio passages
    assert len(about_gpu) >= 6, about_gpu
    if not recorded:
        assert not claims, claims
        for name, p in about_gpu:
            assert "not yet run on a GPU" in p, f"a GPU passage of {name} without its mark: {p[:200]}"
    for name, day in claims:
        assert day in results, f"{name} says tested on GPU on {day}; RESULTS.md has no run of that day"


def test_the_readmes_dcp_block_runs_on_a_first_run_and_on_the_resume_after_it(tmp_path):
    """Run as written in an empty folder (the first run: nothing to resume from), then again in
    the same folder: the second resumes from the first one's checkpoint."""
    from support import readme_blocks
    section = next(name for name in _block_sections() if name.startswith("README.md: PyTorch DCP"))
    (tmp_path / "block.py").write_text(readme_blocks.script(_block_sections()[section]))
    said = []
    for _ in range(2):
        r = _run_block(tmp_path)
        assert r.returncode == 0, r.stderr[-4000:]
        said.append(r.stdout)
    assert "resumed" not in said[0] and "resumed from ckpt/step-0 at step 0" in said[1], said
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step-0", "step-1"]


def test_the_readmes_deepspeed_block_runs_on_the_ranks_its_launch_line_asks_for(tmp_path):
    """The README's own launch line (torchrun, N=2) runs its DeepSpeed block as written on 2 CPU
    ranks: a bare `deepspeed script.py` started one rank there, and the README said nothing more."""
    import shlex
    import sys

    pytest.importorskip("deepspeed")
    from support import readme_blocks
    readme = open(os.path.join(ROOT, "README.md")).read()
    line = re.search(r"`(torchrun --nproc_per_node N script\.py)`", readme)
    assert line, "the README names no torchrun line for N ranks"
    code = _block_sections()["README.md: DeepSpeed"]
    probe = "\nprint('rank', engine.global_rank, 'of', engine.world_size, 'loaded', engine.global_steps, flush=True)\n"
    (tmp_path / "script.py").write_text(readme_blocks.script(code) + probe)
    args = shlex.split(line.group(1).replace(" N ", " 2 "))
    torchrun = os.path.join(os.path.dirname(sys.executable), args[0])
    # --standalone: torchrun binds its own free port (a port found free and given to it could be taken meanwhile)
    r = warm.run([torchrun, "--standalone", *args[1:]], cwd=tmp_path, capture_output=True, text=True,
                 timeout=600, env=dict(os.environ, PYTHONPATH=python_path(ROOT), OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-4000:]
    assert sorted(x for x in r.stdout.splitlines() if x.startswith("rank ")) == [
        "rank 0 of 2 loaded 0", "rank 1 of 2 loaded 0"], r.stdout[-2000:]


def test_the_torchtitan_install_docs_dcp_gives_is_the_one_the_suite_makes():
    """docs/dcp.md said `pip install fastckpt[torchtitan]`, which pulls torchtitan's training stack
    and downgrades fsspec; the install it gives now is the suite's own (the Makefile's torchtitan
    without its dependencies, and the two packages of the dev extra it needs)."""
    doc = open(os.path.join(ROOT, "docs", "dcp.md")).read()
    said = re.search(r"`pip install --no-deps (torchtitan==\S+) ([^`]+)`", doc)
    assert said, "docs/dcp.md gives no install of torchtitan without its training stack"
    assert re.search(rf"pip install -q --no-deps {re.escape(said.group(1))}$",
                     open(os.path.join(ROOT, "Makefile")).read(), flags=re.M)
    dev = open(os.path.join(ROOT, "setup.cfg")).read().split("dev =", 1)[1].split("\n\n", 1)[0].split()
    assert all(pkg in dev for pkg in said.group(2).split()), (said.group(2), dev)


def test_a_doc_call_its_worker_does_not_make_is_named(tmp_path):
    """The link between a page's block and the program its test runs (readme_blocks.calls_not_in):
    a keyword the worker never passes is named."""
    from support import readme_blocks
    (tmp_path / "page.md").write_text('## Lightning\n\n```python\nPreemptCheckpoint(dirpath="ck", grace_s=20)\n'
                                      'trainer.fit(model=module, ckpt_path="last")\n```\n')
    (tmp_path / "worker.py").write_text("PreemptCheckpoint(dirpath=out, signal=s, grace_s=20)\n"
                                        "t.fit(model=model, ckpt_path=a.resume)\n")
    names = ("PreemptCheckpoint", "fit")
    assert readme_blocks.calls_not_in(str(tmp_path / "page.md"), "Lightning", "", str(tmp_path / "worker.py"),
                                      names) == ["PreemptCheckpoint(0 positional, keywords ('dirpath', 'grace_s'))"]
