"""The training strategy: Lightning's DDP, without the DDP wrapper when there is nothing to synchronise.

With several processes this is exactly Lightning's ``DDPStrategy``. With one, the network trains unwrapped,
the way Lightning's single-device strategy trains it: torch's DistributedDataParallel still runs its reducer and
an all-reduce every step when alone, which made the digits MLP's CPU step about 30% slower. The process group is
kept (a group of one), so everything that expects one works the same whatever the world size.
"""

from lightning.pytorch import strategies


class DDPStrategy(strategies.DDPStrategy):
    """Lightning's ``DDPStrategy``; a world of one process trains without the ``DistributedDataParallel`` wrapper."""

    def configure_ddp(self) -> None:
        if self.world_size > 1:
            super().configure_ddp()
