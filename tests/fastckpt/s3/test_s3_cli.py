"""`fastckpt ls / verify / export` on an s3:// place (a real S3 server, SeaweedFS on loopback), run
as a user runs the command: its own process, the server found as AWS tools find it (the
environment). ls lists the committed checkpoints newest first, `latest` marked, a checkpoint cut
short before its record as incomplete and an unfinished multipart upload apart, as no checkpoint;
verify reads every byte of every object; export writes the newest as a plain file."""
from __future__ import annotations

import os
import uuid

import torch

import fastckpt
from fastckpt.format import load_file

from tests.fastckpt.tools.test_first_day import rows, run_cli  # noqa: F401 - the command as a user runs it
from workers.s3_worker import state_for  # noqa: E402


def test_ls_verify_and_export_an_s3_place(s3_env, tmp_path):
    url = f"s3://{s3_env.bucket}/cli-{uuid.uuid4().hex[:8]}"
    ck = fastckpt.Checkpointer(url, keep=0)
    try:
        for step in (1, 2):
            ck.save(state_for(0, step, 6), step=step).wait()
        bucket, prefix = ck.store.bucket, ck.store.where.key("")
        bucket.put_bytes(prefix + "step-00000003.c000003/rank-0.pt", b"cut short before its record")
        bucket.control.create_multipart_upload(Bucket=s3_env.bucket, Key=prefix + "step-00000004.c000004/rank-0.pt")
    finally:
        ck.close()
    listed = run_cli("ls", url)
    assert listed.returncode == 0, listed.stderr
    out = listed.stdout
    assert rows(out) == [(False, "step-00000003.c000003"), (True, "step-00000002.c000002"),
                         (False, "step-00000001.c000001")], out
    assert "incomplete" in out and "not checkpoints" in out and "step-00000004.c000004/rank-0.pt" in out, out
    verified = run_cli("verify", url)
    assert verified.returncode == 0 and "OK: every byte checks" in verified.stdout, verified.stdout + verified.stderr
    assert f"{url}/step-00000002.c000002/rank-0." in verified.stdout, verified.stdout
    out_file = str(tmp_path / "model.safetensors")
    exported = run_cli("export", url, out_file, "--to", "safetensors")
    assert exported.returncode == 0 and "step 2" in exported.stdout, exported.stdout + exported.stderr
    assert torch.equal(load_file(out_file)["w"], state_for(0, 2, 6)["w"])
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("fastckpt-s3-")
                and not os.path.exists(f"/proc/{n.split('-')[2]}")]  # no spool left by the commands
