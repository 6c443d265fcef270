"""``Safeguards`` (the ``safeguards`` config key): the callbacks every run gets, one concern each, each on by default
and each a switch (``--safeguards.nan_guard false``). The preemption check has its own key (``preemption``).

Their cost, the template's reference figures on a 2-core CPU (docs/performance.md): each callback costs Lightning a
call of each of its hooks, about 6 a training step at up to 4 µs a call, so at most about 25 µs a step each, next to
the digits MLP's 0.9 ms step and a CNN's 0.4 s; what each does beside is below, next to its switch.
"""

from lightning.pytorch import Callback

from trainfleet.checkpoints.resume_state import ResumeState
from trainfleet.runtime.faults import FailFast
from trainfleet.runtime.nan_guard import NaNGuard
from trainfleet.runtime.throughput import Throughput


class Safeguards:
    def __init__(
        self, fail_fast: bool = True, nan_guard: bool = True, throughput: bool = True, resume_state: bool = True
    ) -> None:
        """
        Args:
            fail_fast: ``FailFast``: a failed rank named and the other ranks stopped; each rank's heartbeat names the
                one that hangs. Cost: a heartbeat thread per rank and a counter per step. Off: a failed rank can leave
                the others waiting up to the process-group timeout.
            nan_guard: ``NaNGuard``: a NaN or inf loss stops the run (exit 3) before a checkpoint holds the damage.
                Cost: one host sync per ``log_every_n_steps`` window. Off: a diverged run trains on and saves NaNs.
            throughput: ``Throughput``: samples/s, TFLOP/s and MFU per window. Cost: an addition per step, a timer and
                a host sync per window, one FLOP count on meta tensors at the start. Off: no speed figures.
            resume_state: ``ResumeState``: every rank's RNG states and the ``metrics.csv`` rows in each checkpoint,
                restored on resume. Cost: a gather of RNG states (a collective) at each checkpoint. Off: a resumed
                run's dropout and augmentation draw other numbers than the uninterrupted run's.
        """
        self.switches = {FailFast: fail_fast, NaNGuard: nan_guard, Throughput: throughput, ResumeState: resume_state}

    def callbacks(self) -> list[Callback]:
        """The callbacks switched on, in the order their hooks run (``cli.add_safeguards``)."""
        return [callback() for callback, on in self.switches.items() if on]
