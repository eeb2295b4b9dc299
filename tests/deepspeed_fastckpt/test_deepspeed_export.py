"""What a DeepSpeed call writes outside a tag, and a failed tag raised on every rank or on none:
real deepspeed.initialize engines on 2 gloo ranks (tests/workers/ds_export_worker.py).

- save_16bit_model (ZeRO 2 and 3), as DeepSpeed's own
  TestZeROSaveLoadEdgeCase::test_save_before_accum_grad_is_done calls it: the file is a plain
  durable file in save_dir when the call returns — no tag folder, no record — and loads to the
  model's values; the save_checkpoint after it commits as usual;
- a tag whose write (or, behind a memory tier, whose copy to the tag folder) fails on rank 0 while
  rank 1's commit thread records the failure seconds late:
  both ranks raise at the same next save_checkpoint (its create(), before DeepSpeed's own tag
  check), neither waits for the other past the deadline, and destroy() raises nothing twice;
- a process leaving through os._exit (DeepSpeed's own harness) with a tag in flight: that tag is
  never committed, and a resume loads the one before it, saying so.
"""
from __future__ import annotations

import os
import time

import pytest
import torch

from support.deepspeed_runs import launch
from support.processes import outputs_of

pytest.importorskip("deepspeed")


def run_ranks(mode: str, save_dir, out, *extra: str, timeout: float = 180, **env) -> list[dict]:
    """Both ranks of ds_export_worker.py MODE; each one's OUT.RANK (they must exit 0 within timeout)."""
    procs = launch(mode, save_dir, out, *extra, ranks=2, script="ds_export_worker.py", **env)
    logs = outputs_of(procs, timeout, mode)
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{log[-6000:]}"
    return [torch.load(f"{out}.{rank}", weights_only=False) for rank in (0, 1)]


@pytest.mark.parametrize("stage", [2, 3])
def test_save_16bit_model_writes_one_durable_file_and_no_tag(tmp_path, stage):
    save_dir = tmp_path / "export"
    got = run_ranks("export", save_dir, tmp_path / "out", "--stage", str(stage))
    for rank, out in enumerate(got):
        assert "error" not in out, (rank, out.get("error"))
        assert out["saved"] is True
        assert out["after_export"] == ["model.pt"], out["after_export"]  # no tag folder, no mark, no hidden file
        assert {"fastckpt-latest", "global_step0", "latest", "model.pt"} <= set(out["after_save"]), out["after_save"]
    exported, model = got[0]["exported"], got[0]["model"]
    assert exported.keys() == model.keys()
    for name, value in model.items():
        assert torch.equal(exported[name].float(), value.float()), name
    assert (save_dir / "global_step0" / "COMMIT").is_file()


@pytest.mark.parametrize("tiers", [False, True], ids=["write", "persist"])
def test_a_tag_failed_on_one_rank_is_raised_on_every_rank_at_the_same_save(tmp_path, fault_shim, shm, tiers):
    """write: rank 0's optimizer file of global_step2 fails as it is written. persist: the entry has
    a memory tier; that file commits in memory and its copy to the tag folder fails (a tag whose
    files are not all on disk is never committed, in memory or not)."""
    save_dir = tmp_path / "ck"
    faulty = str(save_dir / "global_step2" / ".zero_pp_rank_0_")  # rank 0's optimizer file of that tag alone
    memory = {"TIERS": os.path.join(shm, "memory")} if tiers else {}
    t = time.monotonic()
    got = run_ranks("held-error", save_dir, tmp_path / "out", timeout=60, LD_PRELOAD=fault_shim,
                    FASTCKPT_FAULT_PATH=faulty, HOLD_RANK="1", HOLD_S="6", **memory)
    took = time.monotonic() - t
    for rank, out in enumerate(got):
        assert out["raised_at"] == 3, (rank, out)  # the next save after the failed tag, on both ranks
        assert "global_step2" in out["error"] and out["took_s"] < 30, (rank, out)
        assert "destroy_error" not in out, (rank, out)  # raised once, not again at destroy
    assert "Input/output error" in got[0]["error"] and "said by rank 0" in got[1]["error"], got
    assert took < 60
    assert not (save_dir / "global_step2" / "COMMIT").exists() and (save_dir / "global_step1" / "COMMIT").exists()
    assert (save_dir / "fastckpt-latest").read_text() == "global_step1"


def test_a_tag_in_flight_when_a_process_leaves_through_os_exit_is_never_committed(tmp_path, fault_shim):
    """global_step2's writes are held (the fault shim, never let go) so that it is surely in flight
    when both ranks leave through os._exit."""
    save_dir = tmp_path / "ck"
    held = {"LD_PRELOAD": fault_shim, "FASTCKPT_FAULT_PATH": os.path.join(save_dir / "global_step2", ""),
            "FASTCKPT_FAULT_HOLD": str(tmp_path / "never")}
    launched = launch("exit-in-flight", save_dir, tmp_path / "out", ranks=2, script="ds_export_worker.py", **held)
    for p in launched:
        log = p.communicate(timeout=180)[0]
        assert p.returncode == 0 and "exiting" in log, log[-3000:]
    assert (save_dir / "global_step1" / "COMMIT").is_file()
    assert not (save_dir / "global_step2" / "COMMIT").exists()  # its files may be there; its record never is
    got = run_ranks("resume", save_dir, tmp_path / "out2")
    for out in got:
        assert os.sep + "global_step1" + os.sep in out["path"], out
        assert any("global_step2" in w for w in out["warnings"]), out["warnings"]
