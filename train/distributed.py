"""Several training processes: one per GPU (NCCL), or CPU processes (gloo) so the same code is tested anywhere.

`torchrun --nproc-per-node N -m pipeline pretrain ...` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT; `setup` joins the group from them, and `pipeline pretrain --gpus N` runs exactly that command.
Without those variables everything here is the identity: one process, rank 0 of 1, no collectives.

The global batch is split evenly: rank r trains on rows r*B/N .. (r+1)*B/N of every global batch, whose order
and augmentation draws depend only on (seed, epoch, step). So N processes see exactly the views one process
would, and the contrastive losses gather every rank's embeddings (`gather_with_grad`) so each rank's
negatives are the whole global batch.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

import torch
import torch.distributed as dist

from core.errors import PipelineError

# torch >= 2.13 flags torch.distributed.nn.functional.all_gather as deprecated in favour of a private module
# (torch.distributed._functional_collectives) that older torch versions the project supports lack; the public
# function works on all of them.
warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated")


def launched() -> bool:
    """True inside a process started by torchrun with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def env_rank() -> int:
    """This process's rank as torchrun set it (0 outside torchrun); valid before and after the group exists."""
    return int(os.environ.get("RANK", "0"))


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0: the one process that writes checkpoints, logs and the progress bar."""
    return rank() == 0


def setup(device: torch.device) -> torch.device:
    """Join the process group torchrun describes (if any) and return this process's device: cuda:LOCAL_RANK for
    CUDA (NCCL), the given device otherwise (gloo). A group already joined (tests) is reused."""
    if not launched():
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise PipelineError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA devices are visible: "
                                f"use --gpus {torch.cuda.device_count()} or fewer")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    elif device.type == "mps":
        raise PipelineError("several processes on MPS are not supported (one Apple GPU): drop --gpus / torchrun")
    global _joined_here
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        _joined_here = True
    return device


_joined_here = False  # whether `setup` joined the group (then `cleanup` leaves it; a caller's own group stays)


def cleanup(wait: bool = True) -> None:
    """Leave the group `setup` joined: once every rank got here (wait), or at once when this rank failed (the
    others would never reach a barrier; torchrun stops them when this process exits)."""
    global _joined_here
    if _joined_here and dist.is_initialized():
        if wait:
            # NCCL's barrier needs a device; named here, torch need not guess it from the current context (and warn)
            nccl = dist.get_backend() == "nccl"
            dist.barrier(device_ids=[torch.cuda.current_device()] if nccl else None)
        dist.destroy_process_group()
        _joined_here = False
    global _cpu_group
    _cpu_group = None  # a group dies with its process group; a caller's own group (tests) may be joined again


_cpu_group = None  # where `any_rank` meets: the default group under gloo, a gloo group of its own beside NCCL


def any_rank(value: int) -> int:
    """The largest of every rank's `value` (0 = nothing to say), the same on every rank. Host to host over gloo
    even when training runs on NCCL: a CPU tensor's all-reduce never waits for a GPU, so the steps the host
    queued ahead stay queued. Every rank must call it at the same point (it is a collective)."""
    global _cpu_group
    if not active():
        return value
    if _cpu_group is None:
        _cpu_group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_cpu_group)
    return int(t.item())


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Every rank's x concatenated in rank order; gradients flow back to the rank that owns each row (the
    backward sums, over ranks, the gradient of each rank's loss with respect to this rank's rows)."""
    if not active():
        return x
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x.contiguous()))


def mean(x: torch.Tensor) -> torch.Tensor:
    """Average of a detached tensor over ranks (the logged loss); a NaN on any rank reaches every rank, so all
    stop together instead of leaving the others waiting in a collective."""
    if not active():
        return x.detach()
    y = x.detach().clone()
    dist.all_reduce(y)
    return y / world_size()


def broadcast_from_main(module: torch.nn.Module) -> None:
    """Every rank starts from rank 0's parameters and buffers (what DDP does when it wraps a model): the ranks
    seed alike, but a checkpoint or a user's init must not depend on that."""
    if active():
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)


def flat_gradients(params) -> torch.Tensor:
    """One flat buffer holding the gradient of every parameter that trains: each p.grad becomes a view of it with
    p's own strides (channels_last stays channels_last), so autograd accumulates into it in place and one
    all-reduce of the buffer averages every gradient. DDP's reducer does this from hooks inside the backward,
    which a CUDA graph cannot hold; this way the backbone's backward stays one graph launch and the reduction is a
    single collective after it. Keep the grads: zero the buffer (`.zero_()`), never set them to None."""
    params = [p for p in params if p.requires_grad]
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) != 1:
        raise PipelineError(f"the parameters that train must share one dtype and device to share one gradient "
                            f"buffer, found {sorted(map(str, kinds))}")
    flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:
        if not (p.is_contiguous() or p.is_contiguous(memory_format=torch.channels_last)):
            raise PipelineError(f"a parameter of shape {tuple(p.shape)} is not dense: it cannot view the gradient buffer")
        p.grad = flat.as_strided(p.shape, p.stride(), offset)  # dense: covers exactly offset .. offset + numel
        offset += p.numel()
    return flat


def average_(flat: torch.Tensor) -> None:
    """Average a gradient buffer over ranks in place (sum, then divide: exact for a power-of-two world, and what
    DDP computes)."""
    if active():
        dist.all_reduce(flat)
        flat.div_(world_size())


def torchrun_command(nproc: int, args: list[str]) -> list[str]:
    """What `--gpus N` runs: torchrun (as `python -m torch.distributed.run`, so the same interpreter and
    environment) on a free local port, starting `python -m pipeline ARGS` N times; `launch` runs the same arguments
    through torchrun's own entry point inside the launching process."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "pipeline", *args]


def launch(nproc: int, args: list[str], device: str) -> int:
    """Run `pipeline ARGS` in nproc processes through torchrun's agent, in this process (what the torchrun command
    runs); returns the exit code. In this process, so that a Ctrl-C or SIGTERM here is torchrun's own: it passes the
    signal on to every worker, waits for them to stop (they write their checkpoint: train/training.StopRequest)
    and raises, which ends here as exit 130, where a torchrun child would print a traceback and be killed by
    subprocess.call. A worker's failure has already printed its one line; its exit code is returned."""
    if nproc < 1:
        raise PipelineError(f"--gpus must be >= 1, got {nproc}")
    if device != "cpu":
        if torch.cuda.is_available():
            if nproc > torch.cuda.device_count():
                raise PipelineError(f"--gpus {nproc}: only {torch.cuda.device_count()} CUDA device(s) visible")
        elif device != "auto" or (torch.backends.mps.is_built() and torch.backends.mps.is_available()):
            raise PipelineError(f"--gpus {nproc} needs CUDA GPUs; use --device cpu for CPU processes (gloo)")
    # torchrun sets OMP_NUM_THREADS=1 in each process when it is unset, and prints a warning saying so; the cores
    # split evenly between the processes is the better value, and set here the warning has nothing to say.
    os.environ["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // nproc))
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    for name in list(logging.root.manager.loggerDict):  # torchrun's modules set their own levels when imported
        if name.startswith("torch.distributed.elastic"):  # "Received 2 death signal, ...": expected here, not news
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        torchrun.run(torchrun.parse_args(torchrun_command(nproc, args)[3:]))
    except SignalException:
        return 130  # the workers have stopped; rank 0 said at which step
    except ChildFailedError as e:
        return next((f.exitcode for f in e.failures.values() if f.exitcode > 0), 1)
    return 0
