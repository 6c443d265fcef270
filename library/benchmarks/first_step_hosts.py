"""Time from launch to first step of a fit of 2 nodes of 1 process, on 2 hosts (tests/multi_host.py: network
namespaces joined by a bridge, hostnames on 127.0.0.1, a decoy docker0, no interface set) against 1 host (both
nodes on this machine's loopback), alternating, medians; and what choosing the interface costs. Needs root.

    python -m benchmarks.first_step_hosts --repeats 5
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.first_step import FLAGS, LAUNCH_TIME, LIBRARY, REPO

sys.path.insert(0, str(LIBRARY / "tests"))
from multi_host import Hosts, start_hosts  # noqa: E402  (the suite's hosts, not a copy)

NODES = ("--trainer.num_nodes=2", "--trainer.devices=1")
INTERFACE_CHOICE = (
    "import os, timeit; from trainfleet.runtime import network;"
    "env = dict(os.environ); env.pop('GLOO_SOCKET_IFNAME', None); env.pop('NCCL_SOCKET_IFNAME', None);"
    "choose = lambda: network.choose_interface(dict(env), '{address}', 29500, True);"
    "seconds = timeit.repeat(choose, number=1, repeat=200);"
    "print(sorted(seconds)[100] * 1e3)"
)


def first_step(hosts: Hosts | None, port: int) -> float:
    """Seconds from the launch of both nodes to rank 0's first step; on HOSTS' first two, or both here."""
    address = hosts[0].address if hosts else "127.0.0.1"
    with tempfile.TemporaryDirectory() as root:
        launch = str(time.time())
        procs = []
        for node in (0, 1):
            env = {**os.environ, "OMP_NUM_THREADS": "1", LAUNCH_TIME: launch, "PYTHONPATH": str(LIBRARY)}
            env.update(NODE_RANK=str(node), MASTER_ADDR=address, MASTER_PORT=str(port))
            for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                env.pop(variable, None)
            argv = [sys.executable, "-m", "project", "fit", *FLAGS, *NODES, f"--trainer.default_root_dir={root}"]
            argv = hosts[node].command(argv) if hosts else argv
            procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, stderr) in zip(procs, outputs, strict=True):
        if proc.returncode:
            raise RuntimeError(stderr.decode()[-3000:])
    line = next(line for line in outputs[0][0].decode().splitlines() if line.startswith("first step"))
    return float(line.split()[2])


def interface_choice_ms(hosts: Hosts) -> float:
    """Median milliseconds of one choice of the interface, on host 1 towards host 0."""
    code = INTERFACE_CHOICE.format(address=hosts[0].address)
    done = subprocess.run(hosts[1].command([sys.executable, "-c", code]), cwd=REPO, capture_output=True, check=True)
    return float(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    hosts = start_hosts(2)
    try:
        times: dict[str, list[float]] = {"1 host": [], "2 hosts": []}
        for _ in range(args.repeats):
            times["1 host"].append(first_step(None, args.port))
            times["2 hosts"].append(first_step(hosts, args.port))
        choice = interface_choice_ms(hosts)
    finally:
        hosts.down()
    for name, values in times.items():
        runs = ", ".join(f"{value:.2f}" for value in values)
        print(f"{name:>7}: median {statistics.median(values):.2f} s to the first step ({runs})")
    ratio = statistics.median(times["2 hosts"]) / statistics.median(times["1 host"])
    print(f"2 hosts / 1 host: {ratio:.3f}; choosing the interface: {choice:.3f} ms (median of 200)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
