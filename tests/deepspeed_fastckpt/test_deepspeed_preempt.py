"""A real SIGTERM to one rank of a 2-rank DeepSpeed job (ZeRO-1, gloo) whose "fastckpt" entry
names preempt_signal, its loop calling deepspeed_fastckpt.at_step_end after every step
(tests/workers/ds_preempt_worker.py):

- both ranks exit with SIGTERM's status within the grace period;
- the tag preempted_step<N> is the save folder's newest committed tag, N the step both ranks
  ended last, the same on both;
- a fresh engine loads it and holds exactly the parameters an uninterrupted run has after N
  steps (ds_worker.py reference);
- the same with a tag saved after every step, in flight when the signal comes;
- a second SIGTERM right after the first ends the job at once, and the newest committed tag then
  loads (whole: the previous one, or the new one if it landed).
"""
from __future__ import annotations

import os
import signal

import pytest
import torch

from support.deepspeed_runs import launch, run
from support.processes import Output

pytestmark = pytest.mark.slow
GRACE_S = 20


def started(save_dir, out, *extra, **env) -> Output:
    return Output(launch("train", save_dir, out, *extra, ranks=2, script="ds_preempt_worker.py", **env))


@pytest.mark.parametrize("saving", [False, True], ids=["between saves", "while tags are saved"])
def test_sigterm_to_one_rank_saves_one_agreed_tag_and_it_resumes_bit_exact(tmp_path, saving):
    save_dir = tmp_path / "ckpt"
    extra, env = (("--save-every", "1"), {"WIDTH": "512"}) if saving else ((), {})
    job = started(save_dir, tmp_path / "unused.pt", *extra, **env)
    job.wait_step(4)
    os.kill(job.procs[1].pid, signal.SIGTERM)
    assert job.ended(GRACE_S) == [-signal.SIGTERM] * 2, job.text()
    last = {max(job.steps(r)) for r in (0, 1)}
    assert len(last) == 1, last
    n = last.pop()
    loaded = run("load", save_dir, tmp_path / "loaded.pt", ranks=2, script="ds_preempt_worker.py", **env)
    assert os.path.basename(os.path.dirname(loaded["path"])) == f"preempted_step{n}" and loaded["global_steps"] == n
    reference = run("reference", tmp_path / "ref", tmp_path / "ref.pt", "--steps", str(n), ranks=2,
                    FASTCKPT_ENTRY='{"concurrency": 2, "chunk_mb": 1}', **env)
    for name, value in reference["params_after"][n - 1].items():
        assert torch.equal(value, loaded["params"][name]), name


def test_a_second_sigterm_ends_the_job_at_once_and_the_newest_tag_loads(tmp_path):
    save_dir = tmp_path / "ckpt"
    job = started(save_dir, tmp_path / "unused.pt")
    job.wait_step(3)
    assert job.signal_twice(signal.SIGTERM) == [-signal.SIGTERM] * 2  # ended within 5 s of the second
    if os.path.isdir(save_dir) and any(n.startswith("preempted_step") for n in os.listdir(save_dir)):
        run("load", save_dir, tmp_path / "loaded.pt", ranks=2, script="ds_preempt_worker.py")  # loads whole
