"""The launch environment, checked before anything starts: each variable the run's cluster environment will read,
named with its value and the range it must be in (the CLI exits 2, before the Trainer or a process group is built).

Unchecked, a wrong value surfaced late and badly (measured with ``python -m project fit --config
configs/digits.yaml`` and the one wrong variable):

- ``MASTER_PORT=99999``: torch's ``port must have value from 0 to 65535`` when the process group formed, under a
  53-line traceback, exit 1; ``MASTER_PORT=abc``: Lightning's ``int()`` of it, a 31-line traceback, exit 1;
- ``NODE_RANK=5`` with ``--trainer.num_nodes 2``: "could not reach the rendezvous ... connection refused", after the
  start-up timeout, which reads like a network fault;
- under torchrun, a ``WORLD_SIZE`` other than ``num_nodes`` x ``devices``: refused by Lightning only once the Trainer
  was built.

What is checked is what will be read: the environment Lightning picks (``accelerator_connector``: the one a config
names in ``trainer.plugins``, else TorchElastic when ``TORCHELASTIC_RUN_ID`` is set, else SLURM under ``srun``, ...,
else ``LightningEnvironment``) and the variables that one reads, each parsed with ``int()`` as it parses them:

- ``LightningEnvironment``: ``MASTER_ADDR``, ``MASTER_PORT`` (unset: a free port, or ``STANDALONE_PORT``),
  ``LOCAL_RANK`` (set: another program started the processes), ``NODE_RANK`` (unset: ``GROUP_RANK``, else 0);
  ``RANK`` and ``WORLD_SIZE`` are not read (the world is ``num_nodes`` x ``devices``);
- ``TorchElasticEnvironment`` (torchrun): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (each required), ``GROUP_RANK``
  (the node's rank), ``MASTER_ADDR``, ``MASTER_PORT``; torchrun's ``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE``,
  ``ROLE_RANK`` and ``ROLE_WORLD_SIZE``, set beside them, must agree with them;
- ``SLURMEnvironment``: ``MASTER_ADDR`` and ``MASTER_PORT`` where set (its task and node counts are refused by
  ``validate_settings``, in ``cli.check_distributed_settings``). Other environments (LSF, MPI, ...) are not checked.
"""

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

PORT_RANGE = (1, 65535)
DETECTED_IN_ORDER = (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment)  # Lightning's order
# The variables each environment's checks read (the fuzz test draws wrong values for each: tests/test_fuzz_inputs.py).
CHECKED_VARIABLES = {
    LightningEnvironment: ("MASTER_ADDR", "MASTER_PORT", "STANDALONE_PORT", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK"),
    TorchElasticEnvironment: (
        *("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        *("GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"),
    ),
    SLURMEnvironment: ("MASTER_ADDR", "MASTER_PORT"),
}
TORCHRUN_SIZES = {"LOCAL_RANK": "LOCAL_WORLD_SIZE", "ROLE_RANK": "ROLE_WORLD_SIZE", "GROUP_RANK": "GROUP_WORLD_SIZE"}


def launch_problem(trainer: Namespace, environ: Mapping[str, str]) -> str | None:
    """What in ENVIRON cannot work with TRAINER (the config's ``trainer`` section), or None: the first problem."""
    environment = chosen_environment(trainer.get("plugins"))
    num_nodes, devices = trainer.get("num_nodes"), device_count(trainer.get("devices"))
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        num_nodes = None  # Lightning refuses it, naming it
    return environment_problem(environment, environ, num_nodes, devices)


def environment_problem(
    environment: type[ClusterEnvironment] | None,
    environ: Mapping[str, str],
    num_nodes: int | None,
    devices: int | None,
) -> str | None:
    """The first problem of ENVIRON for ENVIRONMENT (a class; None: one not checked here), with NUM_NODES nodes of
    DEVICES processes each (None: not known before the Trainer is built)."""
    if environment is None:
        return None
    checks: list[Callable[[], str | None]] = [lambda: address_problem(environ), lambda: port_problem(environ)]
    if issubclass(environment, TorchElasticEnvironment):
        checks += [lambda: torchrun_problem(environ, num_nodes, devices)]
    elif issubclass(environment, LightningEnvironment):
        checks += [lambda: node_rank_problem(environ, num_nodes), lambda: local_rank_problem(environ, devices)]
    elif not issubclass(environment, SLURMEnvironment):
        return None
    return next(filter(None, (check() for check in checks)), None)


def chosen_environment(plugins: Any) -> type[ClusterEnvironment] | None:
    """The cluster environment Lightning will use: the one PLUGINS (``trainer.plugins``) names, else the first that
    detects itself, in Lightning's order; None for one named by a path that cannot be imported (jsonargparse says)."""
    for plugin in plugins if isinstance(plugins, list) else [plugins]:
        path = plugin.get("class_path") if isinstance(plugin, Namespace) else plugin
        if isinstance(plugin, ClusterEnvironment):
            return type(plugin)
        if isinstance(path, str) and "." in path:
            named = imported(path)
            if named is None or (isinstance(named, type) and issubclass(named, ClusterEnvironment)):
                return named
    return next((kind for kind in DETECTED_IN_ORDER if kind.detect()), LightningEnvironment)


def imported(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def device_count(devices: Any) -> int | None:
    """The processes per node that DEVICES (``trainer.devices``) gives, where it says without the accelerator."""
    if isinstance(devices, list):
        return len(devices) or None
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    return None  # "auto", -1 (all), "0,1" (Lightning's parsing) or a value Lightning refuses itself


def integer(environ: Mapping[str, str], name: str) -> tuple[int | None, str | None]:
    """NAME's value parsed as Lightning and torch parse it (``int()``), or the problem that it is not an integer."""
    value = environ[name]
    try:
        return int(value), None
    except ValueError:
        return None, f"{name}={value!r} in the environment is not an integer"


def in_range(environ: Mapping[str, str], name: str, low: int, high: int | None, why: str) -> str | None:
    """Whether the variable NAME (set) is an integer in [LOW, HIGH] (HIGH None: no upper bound); WHY: the range's
    reason, ending the message."""
    number, problem = integer(environ, name)
    if problem:
        return f"{problem}: it must be an integer in {bounds(low, high)} ({why})"
    if number < low or (high is not None and number > high):
        return f"{name}={environ[name]!r} in the environment is out of range: it must be in {bounds(low, high)} ({why})"
    return None


def bounds(low: int, high: int | None) -> str:
    return f"[{low}, {high}]" if high is not None else f">= {low}"


def address_problem(environ: Mapping[str, str]) -> str | None:
    """MASTER_ADDR names the rank-0 node: an empty one, or one with blanks, names no host."""
    value = environ.get("MASTER_ADDR")
    if value is None or (value.strip() and not any(character.isspace() for character in value)):
        return None
    return (
        f"MASTER_ADDR={value!r} in the environment names no host: give the address or host name of the node of"
        " NODE_RANK 0, or unset it (127.0.0.1)"
    )


def port_problem(environ: Mapping[str, str]) -> str | None:
    """MASTER_PORT (or, where it is unset, LightningEnvironment's STANDALONE_PORT) is the rank-0 node's TCP port."""
    name = "MASTER_PORT" if "MASTER_PORT" in environ else "STANDALONE_PORT" if "STANDALONE_PORT" in environ else None
    if name is None:
        return None
    return in_range(environ, name, *PORT_RANGE, "a TCP port of the node of NODE_RANK 0; unset: a free one on one node")


def node_rank_problem(environ: Mapping[str, str], num_nodes: int | None) -> str | None:
    """LightningEnvironment's node rank: NODE_RANK, else GROUP_RANK; 0 to num_nodes - 1."""
    name = "NODE_RANK" if "NODE_RANK" in environ else "GROUP_RANK" if "GROUP_RANK" in environ else None
    if name is None:
        return None
    if not num_nodes:
        return in_range(environ, name, 0, None, "this node's rank")
    why = f"this node's rank, 0 to trainer.num_nodes - 1, with --trainer.num_nodes {num_nodes}"
    return in_range(environ, name, 0, num_nodes - 1, why)


def local_rank_problem(environ: Mapping[str, str], devices: int | None) -> str | None:
    """LOCAL_RANK set: the processes were started by another program, this one the LOCAL_RANK-th of its node."""
    if "LOCAL_RANK" not in environ:
        return None
    if not devices:
        return in_range(environ, "LOCAL_RANK", 0, None, "this process's rank on its node")
    why = f"this process's rank on its node, 0 to trainer.devices - 1, with --trainer.devices {devices}"
    return in_range(environ, "LOCAL_RANK", 0, devices - 1, why)


def torchrun_problem(environ: Mapping[str, str], num_nodes: int | None, devices: int | None) -> str | None:
    """torchrun's variables: each an integer, each rank below its size, and the sizes those of the Trainer."""
    missing = [name for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if name not in environ]
    if missing:
        return (
            f"TORCHELASTIC_RUN_ID is set (a torchrun launch) but {', '.join(missing)} is not: start the run with"
            " torchrun, or unset TORCHELASTIC_RUN_ID"
        )
    expected = {"WORLD_SIZE": num_nodes * devices if num_nodes and devices else None}
    expected |= {"LOCAL_WORLD_SIZE": devices, "GROUP_WORLD_SIZE": num_nodes}
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE"):
        if name in environ and (problem := size_problem(environ, name, expected.get(name), num_nodes, devices)):
            return problem
    for name, size in {"RANK": "WORLD_SIZE", **TORCHRUN_SIZES}.items():
        if name in environ and (problem := rank_problem(environ, name, size, num_nodes)):
            return problem
    return None


def size_problem(
    environ: Mapping[str, str], name: str, expected: int | None, num_nodes: int | None, devices: int | None
) -> str | None:
    """A torchrun size: an integer >= 1 and, where the Trainer's counts give it, EXPECTED."""
    if problem := in_range(environ, name, 1, None, "a number of processes or nodes"):
        return problem
    if expected is None or int(environ[name]) == expected:
        return None
    return (
        f"{name}={environ[name]!r} in the environment (from torchrun) must be {expected}, what"
        f" --trainer.num_nodes {num_nodes} and --trainer.devices {devices} give: torchrun's --nnodes and"
        " --nproc-per-node must match them"
    )


def rank_problem(environ: Mapping[str, str], name: str, size: str, num_nodes: int | None) -> str | None:
    """A torchrun rank, from 0 to its SIZE's value (where set) less one; GROUP_RANK, the node's, also below
    NUM_NODES (the Trainer's)."""
    if size in environ:
        return in_range(environ, name, 0, int(environ[size]) - 1, f"0 to {size} - 1")
    if name == "GROUP_RANK" and num_nodes:
        return in_range(environ, name, 0, num_nodes - 1, "this node's rank, 0 to trainer.num_nodes - 1")
    return in_range(environ, name, 0, None, "a rank")
