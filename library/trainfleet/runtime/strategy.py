"""The training strategy: Lightning's DDP, without the DDP wrapper when there is nothing to synchronise, and with a
process group that survives torchrun's restarts.

With several processes this is Lightning's ``DDPStrategy``. With one, the network trains unwrapped, the way
Lightning's single-device strategy trains it: torch's DistributedDataParallel still runs its reducer and an all-reduce
every step when alone, which slows a small CPU step markedly (docs/performance.md). The process group is kept (a
group of one), so everything that expects one works the same whatever the world size.
"""

import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch import strategies
from torch.distributed.constants import default_pg_timeout

from trainfleet import lightning_internals as internals
from trainfleet.checkpoints.files import is_sharded, load_sharded_as_full
from trainfleet.messages import report
from trainfleet.runtime import rendezvous

STARTUP_TIMEOUT = timedelta(minutes=1)
LIGHTNING_LOG = logging.getLogger("lightning.fabric")  # Lightning's console channel, where it reports joining


class MeetsFirst:
    """What the template's strategies add to Lightning's start-up: with several processes, the ranks meet first within
    ``startup_timeout`` (runtime/rendezvous.py), then form the process group through that store (under torchrun, the
    agent's); Lightning's own set-up then finds the group formed and goes on."""

    startup_timeout: timedelta
    run_facts: dict[str, str]  # what every node must agree on: the CLI sets the resolved config

    def form_process_group(self) -> None:
        self.set_world_ranks()
        if self.world_size > 1 and not dist.is_initialized():
            with self.launched_ranks_watched_here():
                store = self.meet()
            self.join_through(store)

    @contextlib.contextmanager
    def launched_ranks_watched_here(self) -> Iterator[None]:
        """Start-up with the ranks this process launched out of Lightning's watch, which SIGKILLs this process once one
        of them exits non-zero: when the ranks cannot meet, they all end, each with the same verdict, and this one
        reports it. Those still waiting then (on a port another program holds) are stopped."""
        procs = internals.processes_of(self.launcher) or []
        launched = list(procs)
        procs.clear()
        try:
            yield
        except rendezvous.StartupFailed:
            deadline = time.monotonic() + rendezvous.LINGER_S
            for proc in launched:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(deadline - time.monotonic(), 0))
                proc.kill()
            raise
        except BaseException:
            procs.extend(launched)
            raise
        procs.extend(launched)

    def meet(self) -> dist.Store:
        environment = self.cluster_environment
        member = rendezvous.Member(
            environment.global_rank(),
            environment.world_size(),
            environment.node_rank(),
            environment.local_rank(),
            self.num_nodes,
            rendezvous.run_facts(self.run_facts),
        )
        address, port = environment.main_address, environment.main_port
        os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port))  # as Lightning's setup sets them
        try:
            store = rendezvous.join(address, port, member, self.startup_timeout)
        except rendezvous.StartupFailed as error:
            if member.local_rank == 0:  # once per node: its local ranks measured the same
                report(f"start-up failed: {error}")
            raise
        store.set_timeout(process_group_timeout(self))
        return dist.PrefixStore(rendezvous.PROCESS_GROUP_KEYS, store)

    def join_through(self, store: dist.Store) -> None:
        """Initialises the process group through STORE as Lightning's setup would, and says so in its words."""
        rank, world_size = self.cluster_environment.global_rank(), self.cluster_environment.world_size()
        LIGHTNING_LOG.info(f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/{world_size}")
        dist.init_process_group(
            self.process_group_backend or ("nccl" if self.root_device.type == "cuda" else "gloo"),
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=process_group_timeout(self),
            device_id=self.root_device if self.root_device.type != "cpu" else None,  # as Lightning passes it
        )


class DDPStrategy(MeetsFirst, strategies.DDPStrategy):
    """Lightning's ``DDPStrategy``; a world of one process trains without the ``DistributedDataParallel`` wrapper, and
    a sharded (FSDP2) checkpoint loads too, gathered whole in each process's memory."""

    def __init__(
        self,
        *args: Any,
        timeout: timedelta | None = default_pg_timeout,
        startup_timeout: timedelta = STARTUP_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        """Args:
        timeout: how long a rank waits for its peers in a collective (``process_group_timeout`` reads it).
        startup_timeout: how long the ranks may take to meet at start-up; a network fault ends every rank within it,
            saying what was measured (runtime/rendezvous.py).
        """
        super().__init__(*args, timeout=timeout, **kwargs)
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.run_facts = {}

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        if is_sharded(checkpoint_path):
            return load_sharded_as_full(Path(checkpoint_path))
        return super().load_checkpoint(checkpoint_path, weights_only)

    def configure_ddp(self) -> None:
        if self.world_size > 1:
            super().configure_ddp()

    def setup_distributed(self) -> None:
        self.form_process_group()
        super().setup_distributed()


def process_group_timeout(strategy: Any) -> timedelta:
    """How long a rank waits for its peers: the template's strategies keep their ``timeout`` argument; torch's
    default for any other."""
    return getattr(strategy, "timeout", None) or default_pg_timeout
