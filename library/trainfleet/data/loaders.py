"""The training loaders: a batch loader for data sets that fit in memory, and torchdata's for everything else.

torch's DataLoader fetches samples one by one through ``__getitem__`` and collates them; for small
tensors that Python overhead dominates a training step. ``TensorBatchLoader`` slices whole batches out
of pre-loaded tensors instead, in the order of the same sampler a DataLoader would use, so sharding,
shuffling and ``set_epoch`` (which Lightning calls through ``loader.sampler``) behave identically.

Given a GPU ``device``, the tensors move there once and batches are sliced there: no copy per step, and no host
sync (the epoch's order is computed on the host as the sampler gives it, and copied once per epoch).
"""

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Sampler
from torchdata.stateful_dataloader import StatefulDataLoader


class TensorBatchLoader:
    """Yields ``[tensor[idx] for tensor in tensors]`` for batches of sampler indices.

    It is stateful (``state_dict``/``load_state_dict``): Lightning saves how many batches of the
    current epoch were consumed, so a run resumed from a mid-epoch checkpoint continues exactly.
    """

    def __init__(
        self,
        tensors: tuple[Tensor, ...],
        sampler: Sampler[int],
        batch_size: int,
        drop_last: bool = False,
        device: torch.device | None = None,
        mid_epoch: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.tensors = tensors if device is None else tuple(tensor.to(device) for tensor in tensors)
        self.device = device
        self.sampler = sampler
        self.batch_sampler = None  # Lightning inspects DataLoader-like objects for this attribute
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._batches_done = 0
        self._batches_to_skip = 0
        self.mid_epoch = mid_epoch  # False: a position loaded from a checkpoint is not where the epoch resumes

    def __len__(self) -> int:
        num_samples = len(self.sampler) if isinstance(self.sampler, Sized) else len(self.tensors[0])
        if self.drop_last:
            return num_samples // self.batch_size
        return -(-num_samples // self.batch_size)

    def __iter__(self) -> Iterator[list[Tensor]]:
        indices = torch.as_tensor(list(self.sampler), dtype=torch.long)
        if self.device is not None:
            indices = indices.to(self.device, non_blocking=True)
        skip, self._batches_to_skip = self._batches_to_skip, 0
        self._batches_done = skip
        # A resumed epoch's sampler may give fewer indices than its length says (the rest of an epoch begun on
        # another world size: ResumableDistributedSampler): the batches end with its indices.
        stop = len(indices) // self.batch_size * self.batch_size if self.drop_last else len(indices)
        for start in range(skip * self.batch_size, min(len(self) * self.batch_size, stop), self.batch_size):
            batch = indices[start : start + self.batch_size]
            self._batches_done += 1
            yield [tensor[batch] for tensor in self.tensors]

    def state_dict(self) -> dict[str, Any]:
        return {"batches_done": self._batches_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A checkpoint taken at an epoch's last batch resumes at the next epoch (Lightning moves on), from its start.
        done = state["batches_done"]
        self._batches_to_skip = done if self.mid_epoch and done < len(self) else 0


class ResumableDataLoader(StatefulDataLoader):
    """torchdata's ``StatefulDataLoader``, told whether the run resumes inside an epoch (``mid_epoch``).

    When not, a position loaded from the checkpoint is dropped: one taken at an epoch's last batch (every
    ``every_n_train_steps`` that lands there, a preemption stop) says that epoch is not over yet (its iterator never
    ran into its end: Lightning knows the length and stops asking), so torchdata would resume at its end and
    Lightning, which goes on with the next epoch, would train an empty one.
    """

    def __init__(self, *args: Any, mid_epoch: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mid_epoch = mid_epoch

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict if self.mid_epoch else {})
