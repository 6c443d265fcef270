"""FSDP2: the network sharded across ranks, for models whose parameters, gradients and optimizer state do not fit one
device under DDP (``configs/fsdp.yaml``; docs/gpus-and-sharding.md has the arithmetic).

Lightning's ``ModelParallelStrategy`` runs ``torch.distributed.fsdp.fully_shard`` on a ``DeviceMesh``, on CPUs (gloo)
and GPUs (NCCL) alike. This subclass makes it data parallel over every rank (Lightning's default puts every local rank
on the tensor-parallel dimension), shards the network by a policy from the config (the module's ``configure_model``
asks for it), keeps BatchNorm statistics equal on every rank as DDP does, and writes its distributed checkpoints
(a folder, each rank its own shard) atomically and in the background.
"""

import importlib
import os
import shutil
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.constants import default_pg_timeout
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainfleet import lightning_internals as internals
from trainfleet.checkpoints.files import METADATA_FILE, check_sharded, fsync_folder, is_sharded, remove
from trainfleet.checkpoints.writing import until_done, writing
from trainfleet.runtime.strategy import STARTUP_TIMEOUT, MeetsFirst


class FSDP2Strategy(MeetsFirst, ModelParallelStrategy):
    """FSDP2 over every rank: each holds 1/N of every parameter, gradient and optimizer state.

    Args:
        shard_classes: import paths of the ``nn.Module`` classes whose instances become their own shard unit (their
            weights are gathered only while they run); the whole network is one unit besides.
        reshard_after_forward: free a unit's gathered weights after its forward (``False``: keep them until backward,
            more memory, one all-gather less per unit).
        param_dtype: on GPUs, the dtype units compute in (``bfloat16``: FSDP2's mixed precision; gradients are
            reduced in float32). ``null``: the parameters' own.
        async_save: write checkpoints in the background: a save stalls training only while the state is copied.
        tensor_parallel_size: ranks per tensor-parallel group (1: pure data parallelism, what the template's
            networks need).
        process_group_backend, timeout, startup_timeout: as for ``DDPStrategy``.
    """

    def __init__(
        self,
        shard_classes: list[str] | None = None,
        reshard_after_forward: bool = True,
        param_dtype: str | None = None,
        async_save: bool = True,
        tensor_parallel_size: int = 1,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        startup_timeout: timedelta = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(
            tensor_parallel_size=tensor_parallel_size,
            save_distributed_checkpoint=True,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.shard_classes = tuple(
            module_class(name) for name in shard_classes or ["torch.nn.Linear", "torch.nn.Conv2d"]
        )
        self.reshard_after_forward = reshard_after_forward
        if param_dtype is not None and not isinstance(getattr(torch, param_dtype, None), torch.dtype):
            raise ValueError(f"param_dtype must name a torch dtype (e.g. bfloat16), got {param_dtype!r}")
        self.param_dtype = param_dtype
        self.async_save = async_save
        self.tensor_parallel_size = tensor_parallel_size
        self.timeout = timeout  # process_group_timeout reads it
        self.startup_timeout = startup_timeout
        self.run_facts = {}
        self._save_group: dist.ProcessGroup | None = None
        self._stager: DefaultStager | None = None
        self._pending: tuple[Future, Path, Path] | None = None

    def setup_environment(self) -> None:
        internals.set_mesh_sizes(self, self.num_nodes * self.num_processes // self.tensor_parallel_size)
        self.form_process_group()  # Lightning's set-up below finds it formed
        super().setup_environment()
        if self.async_save and self.world_size > 1:
            # Its own gloo group: a background save's collectives must not pair with training's (a shared one hung).
            self._save_group = dist.new_group(backend="gloo", timeout=self.timeout)
            # The shards' copies kept from one save to the next: fresh ones cost their page faults at every save,
            # most of the stall (docs/gpus-and-sharding.md). The next save waits for the previous write first.
            on_gpu = self.root_device.type == "cuda"
            self._stager = DefaultStager(StagingOptions(on_gpu, False, False, False))  # pinned memory on GPUs

    def shard(self, network: nn.Module) -> None:
        """Makes each module of the policy's classes, then the network, a shard unit on the data-parallel mesh. Once:
        ``configure_model`` runs again for each later validate, test or predict."""
        if any(hasattr(parameter, "to_local") for parameter in network.parameters()):
            return
        options: dict[str, Any] = {"mesh": self.device_mesh["data_parallel"]}
        options["reshard_after_forward"] = self.reshard_after_forward
        if self.param_dtype is not None and self.root_device.type == "cuda":
            options["mp_policy"] = MixedPrecisionPolicy(getattr(torch, self.param_dtype), reduce_dtype=torch.float32)
        for module in network.modules():
            if module is not network and isinstance(module, self.shard_classes):
                fully_shard(module, **options)
        fully_shard(network, **options)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """This rank's shards, as they are (Lightning's copies them to the CPU first: most of a save's stall here).
        The checkpoint's writer copies them once, to the file or, in the background, to its staging memory."""
        return get_model_state_dict(self.model, options=StateDictOptions(cpu_offload=False))

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        optimizer = getattr(optimizer, "optimizer", optimizer)  # Lightning's wrapper
        return get_optimizer_state_dict(self.model, optimizer, options=StateDictOptions(cpu_offload=False))

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        """After each step, rank 0's buffers (BatchNorm's running statistics) on every rank, as DDP broadcasts them:
        FSDP2 shards parameters only, and a checkpoint holds one rank's buffers."""
        output = super().optimizer_step(*args, **kwargs)
        if self.world_size > 1:
            for buffer in self.lightning_module.buffers():
                dist.broadcast(buffer, src=0)
        return output

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Writes the shards into ``.NAME.partial`` beside the target and renames it into place once every rank has
        written: a process killed mid-save leaves the previous checkpoint whole. With ``async_save`` the shards are
        written in the background; the rename comes at the next save or at the end of the run."""
        path = Path(self.broadcast(str(filepath)))
        self.finish_pending_save()
        partial = path.with_name(f".{path.name}.partial")
        if self.global_rank == 0:  # no barrier after: DCP's plan, scattered by rank 0, comes before any rank writes
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True, exist_ok=True)  # another rank's DCP writer makes it too, before the plan
        state = {"state_dict": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        if self.global_rank == 0:
            torch.save(checkpoint, partial / METADATA_FILE)  # loops, callbacks, RNG states: small
        if self._save_group is not None:
            group, stager = self._save_group, self._stager
            save = dcp.async_save(state, checkpoint_id=partial, process_group=group, async_stager=stager)
            self._pending = (until_done(save), partial, path)
            return
        with writing():
            dcp.save(state, checkpoint_id=partial)
        self._promote(partial, path)

    def finish_pending_save(self) -> None:
        """Waits for the background save (its writes and its own gloo group's collectives), then renames it into place.
        Every rank calls it before the next save and at the end; it adds no collective, so a failing run can call it
        too (it then waits at most the process-group timeout)."""
        if self._pending is None:
            return
        future, partial, path = self._pending
        self._pending = None
        future.result()
        self._promote(partial, path)

    def _promote(self, partial: Path, path: Path) -> None:
        """Rank 0 renames the written folder into place. DCP's coordinator (rank 0) writes ``.metadata`` last, once
        every rank has reported its shard written: its save returning means the whole checkpoint is there."""
        if self.global_rank != 0 or not is_sharded(partial):
            return
        old = path.with_name(f".{path.name}.old")
        remove(old)  # left by a run killed while removing it
        if path.exists():
            os.rename(path, old)  # a folder cannot be replaced in one rename
        os.rename(partial, path)
        fsync_folder(path.parent)
        remove(old)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(checkpoint_path)
        if is_sharded(path):
            check_sharded(path)
        return super().load_checkpoint(checkpoint_path, weights_only)

    def remove_checkpoint(self, filepath: Any) -> None:
        if self._pending is not None and Path(filepath) == self._pending[2]:  # never one still being written
            self.finish_pending_save()
        super().remove_checkpoint(filepath)

    def teardown(self) -> None:
        """A run that ends, fails or is preempted keeps its last save."""
        if dist.is_available() and dist.is_initialized():
            self.finish_pending_save()
        if self._stager is not None:
            self._stager.close()  # its copies go with it
            self._stager = None
        super().teardown()


def module_class(name: str) -> type[nn.Module]:
    """The ``nn.Module`` class at import path NAME; a clear error for anything else."""
    module, _, attribute = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"shard_classes: cannot import {name!r}") from None
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise ValueError(f"shard_classes: {name} is not a torch.nn.Module class")
    return found
