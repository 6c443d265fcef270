"""What the schedule tests share: the learning rates a scheduler gives, step by step."""

from torch.optim.lr_scheduler import LRScheduler


def rates(scheduler: LRScheduler, steps: int) -> list[float]:
    """The learning rate each of STEPS optimizer steps uses."""
    used = []
    for _ in range(steps):
        used.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return used
