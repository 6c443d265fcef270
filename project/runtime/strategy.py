"""The training strategy: Lightning's DDP, without the DDP wrapper when there is nothing to synchronise, and with a
process group that survives torchrun's restarts.

With several processes this is Lightning's ``DDPStrategy``. With one, the network trains unwrapped, the way
Lightning's single-device strategy trains it: torch's DistributedDataParallel still runs its reducer and an all-reduce
every step when alone, which slows a small CPU step markedly (docs/performance.md). The process group is kept (a
group of one), so everything that expects one works the same whatever the world size.
"""

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch import strategies
from torch.distributed.constants import default_pg_timeout

from project.runs.checkpointing import is_sharded, load_sharded_as_full

LIGHTNING_LOG = logging.getLogger("lightning.fabric")  # Lightning's console channel, where it reports joining


class DDPStrategy(strategies.DDPStrategy):
    """Lightning's ``DDPStrategy``; a world of one process trains without the ``DistributedDataParallel`` wrapper, and
    a sharded (FSDP2) checkpoint loads too, gathered whole in each process's memory."""

    def __init__(self, *args: Any, timeout: timedelta | None = default_pg_timeout, **kwargs: Any) -> None:
        super().__init__(*args, timeout=timeout, **kwargs)
        self.timeout = timeout  # how long a rank waits for its peers: process_group_timeout reads it

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        if is_sharded(checkpoint_path):
            return load_sharded_as_full(Path(checkpoint_path))
        return super().load_checkpoint(checkpoint_path, weights_only)

    def configure_ddp(self) -> None:
        if self.world_size > 1:
            super().configure_ddp()

    def setup_distributed(self) -> None:
        """Under torchrun, joins the process group through a key space of this attempt's own (see ``attempt_store``);
        Lightning's setup then finds the group ready. Elsewhere, Lightning's setup as it is."""
        store = attempt_store(process_group_timeout(self))
        if store is not None:
            self.join_through(store)
        super().setup_distributed()

    def join_through(self, store: dist.Store) -> None:
        """Initialises the process group through STORE as Lightning's setup would, and says so in its words."""
        self.set_world_ranks()
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


def process_group_timeout(strategy: Any) -> timedelta:
    """How long a rank waits for its peers: the template's strategies keep their ``timeout`` argument; torch's
    default for any other."""
    return getattr(strategy, "timeout", None) or default_pg_timeout


def attempt_store(timeout: timedelta) -> dist.Store | None:
    """The torchrun agent's store, under a prefix for this attempt (``TORCHELASTIC_RESTART_COUNT``); None elsewhere.

    torch 2.14's agent keeps one store for every attempt, and no longer prefixes the ranks' keys by attempt: after a
    restart, a rank could read the address a killed rank had published ("Gloo connectFullMesh failed ... Connection
    refused", seen when the new ranks started a few seconds apart) and fail the restart.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"/project/attempt_{attempt}", agent)
