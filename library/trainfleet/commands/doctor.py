"""``python -m project doctor``: what the distributed setup looks like, and whether every rank can talk.

Prints versions, devices, the process-group backend and the cluster environment Lightning detects,
with each process's ranks. Launched distributed, the same way as training (``torchrun ... -m project
doctor``, ``srun python -m project doctor``, or ``--nprocs N --num-nodes M`` with NODE_RANK /
MASTER_ADDR / MASTER_PORT like Lightning's own launcher), it checks an all-reduce sum on every rank
and measures all-reduce bandwidth like nccl-tests' ``all_reduce_perf``. A peer that does not come
fails the run within ``--timeout`` seconds, with a hint, instead of hanging.
"""

import argparse
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import lightning
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.fabric.plugins.environments.lightning import find_free_network_port

from trainfleet import lightning_internals as internals
from trainfleet.messages import first_line, write_line
from trainfleet.runtime import rendezvous

DEBUG_SWITCH = "PROJECT_DIST_DEBUG"
DEBUG_SETTINGS = {"NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
NETWORK_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
# A process still blocked this long after torch's own timeout is stuck where torch does not look (NCCL).
GRACE_S = 10.0
HINT = (
    "  Every node must run the same command with the same MASTER_ADDR and MASTER_PORT and its own NODE_RANK;\n"
    "  num_nodes x processes per node must equal the number of processes started;\n"
    "  the port must be open between the nodes (firewall), and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME\n"
    "  must name the network interface the nodes reach each other on."
)


def say(text: str, error: bool = False) -> None:
    write_line(text, sys.stderr if error else sys.stdout)


def apply_debug_switch() -> None:
    """``PROJECT_DIST_DEBUG=1``: NCCL and torch.distributed debug logs, for training and the doctor alike."""
    if os.environ.get(DEBUG_SWITCH) != "1":
        return
    for name, value in DEBUG_SETTINGS.items():
        os.environ.setdefault(name, value)
    dist.set_debug_level_from_env()  # torch read TORCH_DISTRIBUTED_DEBUG when it was imported


def detect_environment() -> ClusterEnvironment:
    """The cluster environment a Trainer would use, tried in the order of Lightning's accelerator connector."""
    for env_type in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment):
        if env_type.detect():
            return env_type()
    return LightningEnvironment()


def default_backend() -> str:
    """What DDPStrategy picks with ``process_group_backend: null``."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def parse_size(text: str) -> int:
    """``4096``, ``64K``, ``16M``, ``1G`` (binary units) as a number of bytes."""
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in UNITS else (text, "")
    try:
        size = int(number) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4096, 64K, 16M, 1G)") from None
    if size < 4:
        raise argparse.ArgumentTypeError(f"a message holds at least one float32 (4 bytes), got {text!r}")
    return size


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m project doctor",
        description="Report the distributed setup; launched distributed, check and time all-reduce across ranks.",
        epilog="Under torchrun, srun or mpirun the launcher sets ranks and world size; --nprocs and --num-nodes "
        "are for a plain launch (one command per node, with NODE_RANK, MASTER_ADDR and MASTER_PORT), as for "
        f"--trainer.devices/--trainer.num_nodes. {DEBUG_SWITCH}=1 turns on NCCL_DEBUG=INFO and "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL.",
    )
    parser.add_argument("--nprocs", type=int, default=1, help="processes to start on this node (plain launch)")
    parser.add_argument("--num-nodes", type=int, default=1, help="nodes taking part (plain launch)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for peers, and per message size")
    parser.add_argument("--backend", default=default_backend(), help="process-group backend (default: %(default)s)")
    parser.add_argument(
        "--sizes", type=parse_size, nargs="+", default=[2**16, 2**20, 2**24, 2**27], help="message sizes in bytes"
    )
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size first")
    args = parser.parse_args(argv)
    if min(args.nprocs, args.num_nodes, args.iters) < 1 or args.warmup < 0 or args.timeout <= 0:
        parser.error("--nprocs, --num-nodes and --iters must be >= 1, --warmup >= 0, --timeout > 0")
    return args


def node_report(env: ClusterEnvironment, backend: str) -> str:
    """Versions, devices, backend, launcher and network settings of this node."""
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        devices = f"{len(names)} GPU(s): {', '.join(names)}"
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        cuda = f"CUDA {torch.version.cuda}, NCCL {nccl}"
    else:
        devices = f"no GPU; {os.cpu_count()} CPU cores"
        cuda = f"no CUDA device (torch built with CUDA {torch.version.cuda})" if torch.version.cuda else "no CUDA"
    network = ", ".join(f"{name}={os.environ.get(name, '-')}" for name in NETWORK_VARS)
    debug = ", ".join(f"{name}={os.environ.get(name, '-')}" for name in DEBUG_SETTINGS)
    return "\n".join(
        [
            f"== node {env.node_rank()} ({socket.gethostname()})",
            f"versions:    python {platform.python_version()}, torch {torch.__version__}, lightning "
            f"{lightning.__version__}; {cuda}",
            f"devices:     {devices}",
            f"backend:     {backend}",
            f"launcher:    {type(env).__name__} (main address {env.main_address}:{env.main_port})",
            f"network:     {network}",
            f"debug:       {debug}, debug level {dist.get_debug_level().name} ({DEBUG_SWITCH}=1 turns both on)",
            "lightning internals (trainfleet/lightning_internals.py):",
            *internals.report(),
        ]
    )


def rank_device(env: ClusterEnvironment, backend: str) -> torch.device:
    """One GPU per rank with NCCL, as DDP uses them; the CPU otherwise."""
    return torch.device("cuda", env.local_rank()) if backend == "nccl" else torch.device("cpu")


def rank_line(env: ClusterEnvironment, device: torch.device) -> str:
    return (
        f"rank {env.global_rank()}/{env.world_size()}: local rank {env.local_rank()}, node rank {env.node_rank()},"
        f" host {socket.gethostname()}, device {device}, {type(env).__name__}"
    )


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Exits the process if ``what`` is still running after ``seconds``: a stuck collective never returns."""

    def give_up() -> None:
        say(f"doctor: {what} did not finish within {seconds:.0f} s; giving up.\n{HINT}", error=True)
        os._exit(1)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def all_reduce_perf(sizes: list[int], iters: int, warmup: int, device: torch.device, timeout: float) -> list[dict]:
    """Checks and times a float32 sum all-reduce per size; every rank gets the same rows.

    Rank r sends r + 1 everywhere, so every element must come back as 1 + 2 + ... + n. Time is the
    slowest rank's mean; bus bandwidth as nccl-tests: busbw = algbw * 2 (n - 1) / n.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    expected = world * (world + 1) / 2
    rows = []
    for size in sizes:
        count = size // 4
        with deadline(timeout + GRACE_S, f"rank {rank}: all-reduce of {count * 4} bytes"):
            buffer = torch.full((count,), float(rank + 1), device=device)
            dist.all_reduce(buffer)
            wrong = (buffer != expected).sum()
            dist.all_reduce(wrong)
            for _ in range(warmup):
                dist.all_reduce(buffer)
            dist.barrier()
            _synchronize(device)
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buffer)
            _synchronize(device)
            seconds = torch.tensor((time.perf_counter() - start) / iters, dtype=torch.float64, device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        algbw = count * 4 / seconds.item() / 1e9
        rows.append(
            {
                "bytes": count * 4,
                "count": count,
                "time_us": seconds.item() * 1e6,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (world - 1) / world,
                "wrong": int(wrong.item()),
            }
        )
    return rows


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def format_rows(rows: list[dict], world: int, backend: str) -> str:
    lines = [
        f"all-reduce (sum, float32) across {world} ranks, backend {backend}",
        f"{'size(B)':>12} {'count':>11} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}",
    ]
    lines += [
        f"{r['bytes']:>12} {r['count']:>11} {r['time_us']:>10.1f} {r['algbw_GBps']:>12.4f} {r['busbw_GBps']:>12.4f}"
        f" {r['wrong']:>7}"
        for r in rows
    ]
    lines.append(f"Avg bus bandwidth: {sum(r['busbw_GBps'] for r in rows) / len(rows):.3f} GB/s")
    return "\n".join(lines)


def run_rank(env: ClusterEnvironment, args: argparse.Namespace) -> int:
    """One rank: report, join the process group within the timeout, check and time all-reduce."""
    rank, world = env.global_rank(), env.world_size()
    device = rank_device(env, args.backend)
    cuda = device if device.type == "cuda" else None
    if cuda:
        torch.cuda.set_device(cuda)
    if env.local_rank() == 0:
        say(node_report(env, args.backend))
    say(rank_line(env, device))
    address, port = env.main_address, env.main_port
    os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port))
    start = time.perf_counter()
    timeout = timedelta(seconds=args.timeout)
    nodes = count_nodes(env, args)
    facts = rendezvous.run_facts()
    member = rendezvous.Member(rank, world, env.node_rank(), env.local_rank(), nodes, facts, every_pair=True)
    try:
        store = rendezvous.join(address, port, member, timeout)
        with deadline(args.timeout + GRACE_S, f"rank {rank}/{world}: joining the process group"):
            # device_id: NCCL connects here, not at the first all-reduce
            group_store = dist.PrefixStore(rendezvous.PROCESS_GROUP_KEYS, store)
            dist.init_process_group(
                args.backend, store=group_store, rank=rank, world_size=world, timeout=timeout, device_id=cuda
            )
            dist.barrier()
    except rendezvous.StartupFailed as error:
        if env.local_rank() == 0:
            say(f"doctor: rank {rank}/{world}: {error}", error=True)
        return error.exit_code
    except RuntimeError as error:  # torch's DistStoreError / DistNetworkError / timeouts
        what = f"the process group did not form within {args.timeout:.0f} s at {address}:{port}"
        return failed(f"rank {rank}/{world}: {what}", error)
    try:
        if rank == 0:
            say(f"process group: {world} ranks joined in {time.perf_counter() - start:.1f} s")
            for line in rendezvous.connections(store):
                say(f"  {line}")
        rows = all_reduce_perf(args.sizes, args.iters, args.warmup, device, args.timeout)
    except RuntimeError as error:  # a peer that left, or a collective past the timeout
        return failed(f"rank {rank}/{world}: all-reduce failed", error)
    finally:
        dist.destroy_process_group()
    wrong = sum(row["wrong"] for row in rows)
    if rank == 0:
        say(format_rows(rows, world, args.backend))
        verdict = "PASSED" if wrong == 0 else f"FAILED ({wrong} wrong elements)"
        say(f"all-reduce check {verdict}: every element must equal 1 + ... + {world} = {world * (world + 1) // 2}")
    return 0 if wrong == 0 else 1


def count_nodes(env: ClusterEnvironment, args: argparse.Namespace) -> int:
    """How many nodes take part: --num-nodes for a plain launch, else from the launcher's processes per node."""
    if not env.creates_processes_externally:
        return args.num_nodes
    per_node = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
    return max(env.world_size() // max(int(per_node), 1), 1)


def failed(what: str, error: Exception) -> int:
    """Prints WHAT with the first line of torch's error (the rest is C++ stack) and the hint; returns 1."""
    say(f"doctor: {what}: {first_line(error)}\n{HINT}", error=True)
    return 1


def _plain_rank(local_rank: int, args: argparse.Namespace) -> int:
    """A rank of a plain launch, set up the way Lightning's own launcher sets up the processes it starts."""
    os.environ["LOCAL_RANK"] = str(local_rank)
    env = LightningEnvironment()
    env.set_world_size(args.num_nodes * args.nprocs)
    env.set_global_rank(env.node_rank() * args.nprocs + local_rank)
    return run_rank(env, args)


def _spawned_rank(local_rank: int, args: argparse.Namespace) -> None:
    sys.exit(_plain_rank(local_rank, args))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = detect_environment()
    if env.creates_processes_externally:  # torchrun, srun, mpirun, or LOCAL_RANK set by hand
        return run_rank(env, args)
    if args.nprocs * args.num_nodes == 1:
        say(node_report(env, args.backend))
        say(rank_line(env, rank_device(env, args.backend)))
        say(
            "not launched distributed, so no all-reduce check: launch it like training, e.g.\n"
            "  torchrun --standalone --nproc-per-node 2 -m project doctor\n"
            "  srun python -m project doctor\n"
            "  python -m project doctor --nprocs 2   (add --num-nodes N with NODE_RANK/MASTER_ADDR/MASTER_PORT)"
        )
        return 0
    if args.num_nodes > 1 and "MASTER_PORT" not in os.environ:
        say("doctor: --num-nodes > 1 needs MASTER_PORT, the same free port on every node", error=True)
        return 2
    # Chosen once here, so the processes started below all meet on the same port.
    os.environ.setdefault("MASTER_PORT", str(find_free_network_port()))
    if args.nprocs == 1:
        return _plain_rank(0, args)
    try:
        torch.multiprocessing.start_processes(_spawned_rank, (args,), nprocs=args.nprocs, start_method="spawn")
    except torch.multiprocessing.ProcessExitedException as error:
        say(f"doctor: {error}", error=True)
        return 1
    return 0
