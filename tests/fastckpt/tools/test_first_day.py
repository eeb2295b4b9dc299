"""A user's first day, as the docs say (issue 65): each test takes the steps a new user took and
fails where they were let down.

- `fastckpt ls` of a Lightning folder after a real kill -9: no file of a save in flight is listed
  as a checkpoint or under its target's name, the newest is marked; `verify` skips those files;
  `export` of the folder takes the newest that loads and says which step it wrote.
- `ls` and `verify` import no framework for a folder that is not that framework's, and print
  nothing but their answer.
- `export --to safetensors`: what `safetensors.torch.load_file` returns is exactly the state's
  tensors, each under its dotted path.
- A progress bar on a terminal for long work (verify, export, load), and nothing when the output
  is no terminal.
"""
from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
import torch

from support.paths import ROOT, WORKERS, python_path
from support.states import flip_byte

FASTCKPT = [sys.executable, "-m", "fastckpt.tools.cli"]
TMP = re.compile(r"^\..+\.fastckpt-\d+-\d+\.tmp$")


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command as a user runs it: its own process, output to pipes (no terminal)."""
    return subprocess.run(FASTCKPT + list(args), capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=python_path(ROOT), **(env or {})))


def rows(out: str) -> list[tuple[bool, str]]:
    """(marked latest, name) of each row of `fastckpt ls`'s table (the lines before its notes)."""
    table = out.split("\n* the ", 1)[0].split("not checkpoints:", 1)[0]
    return [(line.startswith("*"), line[2:].split()[0]) for line in table.splitlines()[2:] if line.strip()]


@pytest.fixture(scope="module")
def killed_lightning_folder(tmp_path_factory):
    """A real Lightning run with FastCheckpointIO and ModelCheckpoint(save_last=True), killed with
    SIGKILL while a file of a save was in flight, after a few checkpoints had landed (a kill that
    lands just after the file was renamed into place leaves none: that run is made again)."""
    for _ in range(3):
        folder = _killed_run(tmp_path_factory.mktemp("killed"))
        if any(TMP.match(n) for n in os.listdir(folder)):
            return folder
    raise AssertionError("3 kills with a save in flight left no file of it")


def _killed_run(out) -> str:
    folder = out / "ck"
    proc = subprocess.Popen([sys.executable, os.path.join(WORKERS, "lit_worker.py"), str(out), "--epochs", "60",
                             "--big", "2", "--sleep", "0.02"], cwd=WORKERS, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=python_path(ROOT, WORKERS)))
    seen = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            names = os.listdir(folder) if folder.is_dir() else []
            done = [n for n in names if n.startswith("epoch=")]
            seen = [n for n in names if TMP.match(n)]
            if len(done) >= 3 and seen:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and seen, "the run was not killed with a save in flight"
    return folder


def test_ls_after_a_kill_lists_no_file_in_flight_as_a_checkpoint_and_marks_the_newest(killed_lightning_folder):
    folder = killed_lightning_folder
    r = run_cli("ls", str(folder))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    listed = rows(r.stdout)
    names = [n for _, n in listed]
    assert len(names) == len(set(names)), f"a name listed twice:\n{r.stdout}"
    assert all((folder / n).is_file() for n in names), f"a row names no file:\n{r.stdout}"
    on_disk = sorted(n for n in os.listdir(folder) if not TMP.match(n))
    assert sorted(names) == on_disk
    temporaries = sorted(n for n in os.listdir(folder) if TMP.match(n))
    apart = r.stdout.split("not checkpoints:", 1)[1]
    assert all(t in apart for t in temporaries), r.stdout
    # the newest: the highest step (then the newest file, which of two files of that step depends on
    # which save's last write landed last: ModelCheckpoint saves the epoch file and last.ckpt side by side)
    step_of = {line[2:].split()[0]: int(line[2:].split()[1]) for line in r.stdout.splitlines()
               if line[2:].split()[:1] and line[2:].split()[0] in names}
    top = max(int(re.search(r"step=(\d+)", n)[1]) for n in names if n.startswith("epoch="))
    marked = [n for is_marked, n in listed if is_marked]
    assert len(marked) == 1 and step_of[marked[0]] == top, r.stdout
    assert "* the newest" in r.stdout


def test_verify_after_a_kill_reads_the_checkpoints_and_skips_the_files_in_flight(killed_lightning_folder):
    r = run_cli("verify", str(killed_lightning_folder))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    temporaries = [n for n in os.listdir(killed_lightning_folder) if TMP.match(n)]
    assert all(f"skip    {killed_lightning_folder / t}: not a checkpoint" in r.stdout for t in temporaries), r.stdout
    assert "OK: every byte checks" in r.stdout


def test_export_of_a_lightning_folder_takes_the_newest_that_loads_and_says_its_step(killed_lightning_folder,
                                                                                     tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    for name in os.listdir(killed_lightning_folder):
        (folder / name).write_bytes((killed_lightning_folder / name).read_bytes())
    steps = sorted(int(re.search(r"step=(\d+)", n)[1]) for n in os.listdir(folder) if n.startswith("epoch="))
    r = run_cli("export", str(folder), str(tmp_path / "out.pt"), "--to", "torch")
    assert r.returncode == 0, r.stderr
    assert f": step {steps[-1]} (" in r.stdout, r.stdout
    assert torch.load(tmp_path / "out.pt", weights_only=True)["global_step"] == steps[-1]
    newest = next(n for n in os.listdir(folder) if n.endswith(f"step={steps[-1]}.ckpt"))
    for name in [newest] + [n for n in os.listdir(folder) if n.startswith("last")]:
        flip_byte(folder / name, at=0.5)  # damaged: passed over, said
    r = run_cli("export", str(folder), str(tmp_path / "out.pt"), "--to", "torch")
    assert r.returncode == 0, r.stderr
    assert f": step {steps[-2]} (" in r.stdout and "passed over: " + newest in r.stdout, r.stdout
    r = run_cli("export", str(folder), str(tmp_path / "out.pt"), "--to", "torch", "--step", str(steps[-1] + 1))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "no loadable checkpoint of step" in r.stderr


# -- no framework imported for another's folder, nothing printed but the answer ---------------------
PROBE = """
import sys
from fastckpt.tools.cli import main
code = main(sys.argv[1:])
print("IMPORTED", *sorted(m for m in ("deepspeed", "lightning", "torchtitan") if m in sys.modules))
"""


def _probe(*args: str) -> tuple[subprocess.CompletedProcess, set]:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=python_path(ROOT)))
    said = next(line for line in r.stdout.splitlines() if line.startswith("IMPORTED"))
    return r, set(said.split()[1:])


@pytest.fixture(scope="module")
def folders(tmp_path_factory, killed_lightning_folder):
    """A Lightning folder, a DCP folder (FastStorageWriter's and DCP's own writer's) and a root."""
    import torch.distributed.checkpoint as dcp

    from fastckpt import Checkpointer
    from fastckpt.dcp import FastStorageWriter
    base = tmp_path_factory.mktemp("kinds")
    dcp.save({"w": torch.ones(4)}, storage_writer=FastStorageWriter(str(base / "dcp"), step=1))
    dcp.save({"w": torch.ones(4)}, storage_writer=dcp.FileSystemWriter(str(base / "dcp" / "step-2")))
    with Checkpointer(str(base / "root")) as ck:
        ck.save({"w": torch.ones(4)}, step=1)
    return {"lightning": str(killed_lightning_folder), "dcp": str(base / "dcp"), "root": str(base / "root")}


@pytest.mark.parametrize("kind", ["lightning", "dcp", "root"])
@pytest.mark.parametrize("cmd", ["ls", "verify"])
def test_ls_and_verify_import_no_framework_of_another_folder_and_print_only_their_answer(folders, kind, cmd):
    r, imported = _probe(cmd, folders[kind])
    assert r.returncode == 0, r.stderr
    assert imported == set(), imported  # no DeepSpeed, Lightning or torchtitan: none of these folders is theirs
    assert r.stderr == "", f"`fastckpt {cmd}` of a {kind} folder printed more than its answer:\n{r.stderr}"


def test_a_deepspeed_folder_still_reads_as_deepspeeds(tmp_path):
    """The plugin's folder kind loads without DeepSpeed; a DeepSpeed folder is still its kind."""
    pytest.importorskip("deepspeed")
    tag = tmp_path / "save" / "global_step3"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}}, tag / "mp_rank_00_model_states.pt")
    (tmp_path / "save" / "latest").write_text("global_step3")
    r, _ = _probe("ls", str(tmp_path / "save"))
    assert r.returncode == 0 and "a DeepSpeed save folder" in r.stdout and "global_step3" in r.stdout, r.stdout


# -- export to safetensors: exactly the state's tensors -------------------------------------------------
def _tensors(obj, path: str = "") -> dict:
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    out = {}
    for k, v in items:
        out.update(_tensors(v, f"{path}.{k}" if path else str(k)))
    return out


def test_a_safetensors_export_holds_exactly_the_states_tensors_by_their_dotted_paths(tmp_path):
    from safetensors.torch import load_file

    from fastckpt import save
    base = torch.arange(6000, dtype=torch.float32)
    state = {"state_dict": {"layer.weight": torch.randn(300, 40), "layer.bias": torch.zeros(40),
                            "tied": base[:1000], "tied_t": base[1000:5000].view(40, 100).t()},
             "optimizer_states": [{"state": {0: {"exp_avg": torch.ones(40), "step": torch.tensor(3.0)}}}],
             "global_step": 7, "epoch": 1}
    save(state, tmp_path / "src.pt")
    r = run_cli("export", str(tmp_path / "src.pt"), str(tmp_path / "out.safetensors"), "--to", "safetensors")
    assert r.returncode == 0, r.stderr
    got, want = load_file(str(tmp_path / "out.safetensors")), _tensors(state)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    assert all(torch.equal(got[k], want[k]) for k in want)
    from fastckpt import load
    back = load(str(tmp_path / "out.safetensors"))  # still a whole state for fastckpt's own reader
    assert back["global_step"] == 7 and torch.equal(back["state_dict"]["tied_t"], state["state_dict"]["tied_t"])


# -- a bar on a terminal, nothing elsewhere --------------------------------------------------------------
def _on_a_terminal(args: list[str], env: dict) -> tuple[int, str]:
    """The command with its stderr on a pseudo-terminal of 40 x 120 (what a user's shell gives)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    said: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            said.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    r = subprocess.run(args, stderr=follower, stdout=subprocess.PIPE, timeout=300,
                       env=dict(os.environ, PYTHONPATH=python_path(ROOT), **env))
    os.close(follower)
    reader.join(10)
    os.close(leader)
    return r.returncode, b"".join(said).decode(errors="replace")


def test_long_work_shows_a_bar_on_a_terminal_and_nothing_elsewhere(tmp_path):
    from fastckpt import save
    save({"w": torch.randn(4 << 20)}, tmp_path / "big.pt")  # 16 MiB: over the bound set below
    small = {"FASTCKPT_PROGRESS_MB": "4"}
    for args, bar in ((["verify", str(tmp_path / "big.pt")], "verify:"),
                      (["export", str(tmp_path / "big.pt"), str(tmp_path / "o.pt"), "--to", "torch"], "export: writing"),
                      (["export", str(tmp_path / "big.pt"), str(tmp_path / "o.safetensors"), "--to", "safetensors"],
                       "load big.pt:")):
        code, terminal = _on_a_terminal(FASTCKPT + args, small)
        assert code == 0 and bar in terminal and "%|" in terminal, (args, terminal)
        piped = run_cli(*args, env=small)
        assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    code, terminal = _on_a_terminal(FASTCKPT + ["verify", str(tmp_path / "big.pt")], {"FASTCKPT_PROGRESS_MB": "64"})
    assert code == 0 and "%|" not in terminal  # work too small for a bar gets none
