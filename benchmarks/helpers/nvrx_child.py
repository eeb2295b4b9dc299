"""One rank of benchmarks/tiers.py's rows for NVIDIA's resiliency extension (nvidia-resiliency-ext,
installed from the registry): its local checkpointing, LocalCheckpointManager with a
CliqueReplicationStrategy (replication_factor=2, replication_jump=1: rank 0 and rank 1 hold each
other's part), on 2 gloo ranks (env RANK, WORLD_SIZE, MASTER_*), started fresh as a restarted job is.

  nvrx_child.py save LOCAL MB              one checkpoint of MB MiB per rank, then "saved
                                           SAVE_S" (how long save() blocked) and sleeps (killed)
  nvrx_child.py resume LOCAL MB            find_latest() and load(), one training step: "resumed
                                           LOAD_S WHERE" (own | replica | none: no local checkpoint)
  nvrx_child.py train LOCAL MB STEPS EVERY as tiers_child.py's train mode, a save every EVERY
                                           steps through the manager: "steps T0 T1 ...", "final_wait 0"

Each rank's folder LOCAL/node-R stands for its node's own storage (a RAM disk: LOCAL is on /dev/shm).
On a host the extension runs only its synchronous save: its BasicTensorAwareStateDict asserts every
tensor is on CUDA (HostStateDict below is the same class without that assertion, and leaves loaded
tensors on the host), and its asynchronous save calls torch.cuda.synchronize().
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
from nvidia_resiliency_ext.checkpointing.local.replication.strategies import CliqueReplicationStrategy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiers_child import fixed_step, state_for  # noqa: E402


class HostStateDict(BasicTensorAwareStateDict):
    """The extension's BasicTensorAwareStateDict for host tensors: no CUDA assertion, and loaded
    tensors stay where they are (its own moves them to CUDA)."""

    def __init__(self, state_dict):
        self.state_dict = state_dict
        self._is_hollow = False

    def restore_tensor_device(self, non_blocking=True):
        pass


def manager(local: str, rank: int) -> LocalCheckpointManager:
    strategy = CliqueReplicationStrategy.from_replication_params(replication_jump=1, replication_factor=2)
    return LocalCheckpointManager(os.path.join(local, f"node-{rank}"), session_id="bench", repl_strategy=strategy)


def main() -> None:
    mode, local, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mgr = manager(local, rank)
    if mode == "save":
        t0 = time.perf_counter()
        mgr.save(HostStateDict(dict(state_for(rank, mb))), iteration=1, is_async=False)
        print(f"saved {time.perf_counter() - t0:.4f}", flush=True)
        time.sleep(3600)
    elif mode == "resume":
        t0 = time.perf_counter()
        iteration = mgr.find_latest()
        if iteration < 0:  # nothing local on every rank: the job's global checkpoint, outside the extension
            print(f"resumed {time.perf_counter() - t0:.4f} none", flush=True)
        else:
            own = os.path.exists(mgr._local_ckpt_path_from_id(mgr._ckpt_id(iteration)))  # before load (inspection)
            loaded, _ = mgr.load()
            load_s = time.perf_counter() - t0
            assert torch.equal(loaded.state_dict["w"], state_for(rank, mb)["w"])
            (loaded.state_dict["w"][:1024] * 2).sum()  # the first training step touches the state
            print(f"resumed {load_s:.4f} {'own' if own else 'replica'}", flush=True)
    elif mode == "train":
        steps, every = int(sys.argv[4]), int(sys.argv[5])
        state, a, times = state_for(rank, mb), torch.randn(512, 512), []
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            a = fixed_step(a)
            state["w"][0, 0] = step
            dist.barrier()
            if step % every == 0:
                mgr.save(HostStateDict(dict(state)), iteration=step, is_async=False)
            times.append(time.perf_counter() - t0)
        print("steps " + " ".join(f"{t:.5f}" for t in times), flush=True)
        print("final_wait 0", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
