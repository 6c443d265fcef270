"""The run's coordination at N nodes, on one machine: the template's real code (``runtime/rendezvous.py``'s ``meet``,
``runtime/faults.py``'s ``Heartbeat``, ``runtime/warm_restart.py``'s ``Supervisor``) with each node simulated by
threads of this process (one per node and phase, no training), beside torch's own c10d rendezvous (torchrun's:
``DynamicRendezvousHandler`` on ``C10dRendezvousBackend``) simulated the same way at the same N, in the same run.

What it measures, per N:
- **start-up**: seconds until every node has met (``meet``: store, arrival, config agreement, data-connection probes),
  and connections each node opened or accepted (counted on the sockets: ``socket.create_connection`` and the store's
  clients; node 0 also serves the store, which every node connects to);
- **store load while training**: data segments the store's server received per second (``ss``'s ``data_segs_in``
  on its sockets: one per request here), per node, with every node beating (``Heartbeat``) and supervised
  (``Supervisor`` waiting in the store for a failure);
- **a failure known**: seconds from one node's failure written to the store until every node's supervisor has woken,
  and until every node has read the heartbeats once (what a failing rank reads to name a hung one);
- **a firewalled node named** (``--firewall``): one node's data port refuses; the start-up's message must name it.

Threads share 2 cores and one interpreter here: a real node has its own CPU, so the figures are upper bounds for the
template's code, and torch's rendezvous suffers the same (its compare-and-set retries contend under the GIL).

    python -m benchmarks.scale                      # N = 8 ... 1024: a table, its figures (JSON), a plot (--output)
    python -m benchmarks.scale --nodes 64 256 --torch-timeout 30 --output /tmp/scale
"""

import argparse
import contextlib
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout

from trainfleet.runtime import rendezvous, warm_restart
from trainfleet.runtime.faults import Heartbeat

REPO = Path(__file__).resolve().parents[2]  # the template: its configs and its project
LIBRARY = REPO / "library"
FIGURES = LIBRARY / "docs" / "figures" / "scale"
NODES = (8, 32, 64, 128, 256, 512, 1024)
TIMEOUT = timedelta(seconds=120)
STARTUPS = {  # each start-up measured: how it is labelled
    "threads": "template, threads",
    "torch threads": "torch c10d, threads",
    "processes": "template, processes",
    "torch processes": "torch c10d, processes",
}
ISOLATED_VAR = "SCALE_OWN_NETWORK"  # set in the namespace own_network() made
CONFIG = {f"model.layer_{index}.width": 64 * index for index in range(40)}  # a config's worth of facts to agree on


@dataclass
class Startup:
    nodes: int
    met: int  # nodes whose meet returned
    seconds: float
    connections_per_node: int  # the most any node but node 0 opened or accepted
    failure: str = ""  # the first message, where the nodes did not meet


@dataclass
class Training:
    nodes: int
    requests_per_s: float  # data segments the store received per second
    requests_per_node_s: float
    failure_woke_all_s: float  # the supervisors, from the failure written
    beats_read_by_all_s: float  # every node reading the heartbeats once, in parallel


def run_threads(count: int, target: Callable[[int], object]) -> tuple[list, float]:
    """TARGET(i) for i < COUNT, each on a thread started at once; the results (or exceptions) and the seconds until
    the last returned."""
    results: list = [None] * count
    barrier = threading.Barrier(count + 1)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = target(index)
        except BaseException as error:  # noqa: BLE001  (counted, not raised)
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return results, time.perf_counter() - start


@contextlib.contextmanager
def counted_connections() -> Iterator[Counter]:
    """Counts the TCP connections opened per destination port (``socket.create_connection`` and the store's clients)
    while the block runs: the nodes' threads share these functions."""
    opened: Counter = Counter()
    create, store_class = socket.create_connection, dist.TCPStore

    def counting_create(address: tuple, *args: object, **kwargs: object) -> socket.socket:
        connection = create(address, *args, **kwargs)  # a refused attempt opens nothing
        opened[("probe", _node_of_thread(), address[1])] += 1
        return connection

    def counting_store(host: str, port: int, *args: object, **kwargs: object) -> dist.TCPStore:
        if not kwargs.get("is_master", args[1] if len(args) > 1 else False):
            opened[("store", _node_of_thread(), port)] += 1
        return store_class(host, port, *args, **kwargs)

    socket.create_connection, dist.TCPStore = counting_create, counting_store
    try:
        yield opened
    finally:
        socket.create_connection, dist.TCPStore = create, store_class


def _node_of_thread() -> str:
    """``node-I`` for node I's threads (``_named``, and the store client ``rendezvous`` builds on a thread named
    after its caller's)."""
    return threading.current_thread().name.split("-connect")[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def members(nodes: int) -> list[rendezvous.Member]:
    facts = rendezvous.run_facts(CONFIG)
    return [rendezvous.Member(node, nodes, node, 0, nodes, facts) for node in range(nodes)]


def measure_startup(nodes: int, firewalled: int | None = None) -> tuple[Startup, dist.Store | None]:
    """Every node's ``meet`` on a thread of its own (named ``node-I``); returns the start-up and node 0's store (the
    caller closes it), None where the nodes did not meet. FIREWALLED: that node's data port refuses connections."""
    port, group = free_port(), members(nodes)
    with counted_connections() as opened, refusing_listener(firewalled):
        results, seconds = run_threads(
            nodes, lambda node: _named(node, rendezvous.meet, "127.0.0.1", port, group[node])
        )
    failures = [result for result in results if isinstance(result, BaseException)]
    probe_ports = {
        json.loads(results[0].get(f"project/startup/member/{node}"))["probe"][1]: node
        for node in range(nodes)
        if not failures
    }
    per_node: Counter = Counter()
    for (kind, thread, destination), count in opened.items():
        per_node[thread] += count
        if kind == "probe" and destination in probe_ports:
            per_node[f"node-{probe_ports[destination]}"] += count  # accepted there
    others = [count for thread, count in per_node.items() if thread != "node-0"]
    startup = Startup(
        nodes, nodes - len(failures), seconds, max(others, default=0), str(failures[0]) if failures else ""
    )
    store = None if failures else results[0]
    return startup, store


def _named(node: int, function: Callable, *args: object) -> object:
    threading.current_thread().name = f"node-{node}"
    return function(*args, timeout=TIMEOUT)


@contextlib.contextmanager
def refusing_listener(node: int | None) -> Iterator[None]:
    """Node NODE's data port refuses connections (what a firewall that rejects does): its socket is bound, so no other
    node's listener is handed the same port, and never listens; the rest are the real ``rendezvous.Listener``.
    (Closing a real listener instead let another node's listener take its port, which the probe then reached.)"""
    if node is None:
        yield
        return
    real = rendezvous.Listener

    class Refusing(real):
        def __init__(self) -> None:
            super().__init__()
            if threading.current_thread().name == f"node-{node}":
                host, family = self.address()[0], self.socket.family
                self.close()
                self.socket = socket.socket(family)
                self.socket.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))  # no listener gets this port
                self.address = lambda: [host, self.socket.getsockname()[1]]

    rendezvous.Listener = Refusing
    try:
        yield
    finally:
        rendezvous.Listener = real


def store_segments_in(port: int) -> int:
    """Data segments received so far by the store's server sockets at PORT (``ss``)."""
    listing = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout
    return sum(int(count) for count in re.findall(r"data_segs_in:(\d+)", listing))


def measure_training(nodes: int, seconds: float, devices: int = 1) -> Training:
    """NODES nodes of DEVICES ranks meet, then each rank beats and each node's supervisor waits in the store for
    SECONDS; then one failure is written, and every node reads the beats once."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    world = nodes * devices

    def client() -> dist.Store:
        return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)

    beats = [Heartbeat() for _ in range(world)]
    for rank, beat in enumerate(beats):  # each rank's own client, as each rank process has
        trainer = SimpleNamespace(world_size=world, global_rank=rank, global_step=0, num_devices=devices)
        with _client_store(client):
            beat.start(trainer, TIMEOUT)
    supervisors = [
        warm_restart.Supervisor(dist.PrefixStore("/project/warm_0", client()), budget=3) for _ in range(nodes)
    ]
    woken = [supervisor._failure_seen(0) for supervisor in supervisors]  # each waits on a connection of its own
    time.sleep(1.0)  # the waits are in place; the first beats are written
    before, start = store_segments_in(port), time.perf_counter()
    time.sleep(seconds)
    received = (store_segments_in(port) - before) / (time.perf_counter() - start)
    failed_at = time.perf_counter()
    warm_restart._failed(supervisors[-1].store, 0, "rank 7 exited with code 1")
    for event in woken:
        event.wait(60)
    woke_all = time.perf_counter() - failed_at
    _, read_all = run_threads(nodes, lambda node: beats[node * devices].suspects(world))
    for beat in beats:
        beat.stop()
    del server  # kept until every node is done with it
    return Training(nodes, received, received / nodes, woke_all, read_all)


@contextlib.contextmanager
def _client_store(make: Callable[[], dist.Store]) -> Iterator[None]:
    """``rendezvous.client_store`` (what ``Heartbeat.start`` reaches the store with) gives MAKE's client."""
    real, address = rendezvous.client_store, os.environ.get("MASTER_ADDR")
    rendezvous.client_store = lambda timeout: make()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    try:
        yield
    finally:
        rendezvous.client_store = real
        if address is None:
            os.environ.pop("MASTER_ADDR")
        else:
            os.environ["MASTER_ADDR"] = address


def measure_torch(nodes: int, join_timeout: float) -> Startup:
    """torch's c10d rendezvous (torchrun's ``--rdzv-backend c10d``) at NODES, one thread and store client per node."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    results, seconds = run_threads(nodes, lambda node: _torch_join(port, nodes, join_timeout))
    failures = [result for result in results if isinstance(result, BaseException)]
    del server  # kept until every node has returned
    return Startup(nodes, nodes - len(failures), seconds, 0, repr(failures[0])[:200] if failures else "")


def measure_agreement(nodes: int, rounds: int = 20) -> float:
    """Median seconds of the preemption agreement (``runtime/preemption.py``: every rank sums a flag per rank over
    gloo) among NODES ranks, a gloo process group each, on threads. gloo connects every rank to every other (torch's
    full mesh): N squared sockets in this one process, so it is measured up to a few dozen nodes only."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=TIMEOUT)

    def agree(rank: int) -> list[float]:
        store = dist.PrefixStore("agreement", dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT))
        group = dist.ProcessGroupGloo(store, rank, nodes, TIMEOUT)
        seconds = []
        for _ in range(rounds):
            flags = torch.zeros(nodes, dtype=torch.int32)
            start = time.perf_counter()
            group.allreduce([flags]).wait()
            seconds.append(time.perf_counter() - start)
        return seconds

    results, _ = run_threads(nodes, agree)
    del server
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        raise failures[0]
    return statistics.median(max(result[index] for result in results) for index in range(rounds))


def _torch_join(port: int, nodes: int, join_timeout: float) -> object:
    """One node's join, as torchrun's agent makes it (its handler on the c10d backend, on a store client)."""
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    run_id = f"scale-{nodes}"
    timeout = RendezvousTimeout(join=timedelta(seconds=join_timeout), last_call=timedelta(seconds=1))
    handler = DynamicRendezvousHandler.from_backend(
        run_id, store, C10dRendezvousBackend(store, run_id), nodes, nodes, "127.0.0.1", timeout
    )
    return handler.next_rendezvous()


def run_processes(count: int, target: Callable[[int], object]) -> tuple[list, float]:
    """TARGET(i) for i < COUNT, each in a process forked from this one (which has imported torch already, and must
    hold no threads: run this before the threaded measurements), started at once; each result in words ("" for
    success), and the seconds until the last returned. Every process lives until all have returned: node 0 serves
    what the others use."""
    results, go, release = os.pipe(), os.pipe(), os.pipe()
    children = []
    for index in range(count):
        pid = os.fork()
        if pid == 0:
            os.close(go[1]), os.close(release[1])
            os.read(go[0], 1)
            try:
                kept = target(index)  # noqa: F841  (node 0's store serves the others until the release)
                outcome = ""
            except BaseException as error:  # noqa: BLE001  (reported, not raised)
                outcome = repr(error)[:300].replace("\n", " ")
            os.write(results[1], f"{time.monotonic()}\t{outcome}\n".encode())
            os.read(release[0], 1)  # until the parent closes it
            os._exit(0)
        children.append(pid)
    os.close(results[1]), os.close(go[0]), os.close(release[0])
    start = time.monotonic()
    os.write(go[1], b"x" * count)
    with os.fdopen(results[0]) as reading:
        lines = [reading.readline() for _ in range(count)]
    os.close(release[1])
    for pid in children:
        os.waitpid(pid, 0)
    os.close(go[1])
    ended = [line.rstrip("\n").split("\t", 1) for line in lines]
    return [outcome for _, outcome in ended], max(float(at) for at, _ in ended) - start


def startup_in_processes(nodes: int) -> Startup:
    """``meet`` at NODES, each node a process (``run_processes``); node 0 serves the store."""
    port, group = free_port(), members(nodes)
    outcomes, seconds = run_processes(nodes, lambda node: rendezvous.meet("127.0.0.1", port, group[node], TIMEOUT))
    failures = [outcome for outcome in outcomes if outcome]
    return Startup(nodes, nodes - len(failures), seconds, 0, failures[0] if failures else "")


def torch_in_processes(nodes: int, join_timeout: float) -> Startup:
    """torch's c10d rendezvous at NODES, each node a process, the store served by one more."""
    port = free_port()
    server = os.fork()
    if server == 0:
        store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        time.sleep(join_timeout + 60)
        del store
        os._exit(0)
    try:
        outcomes, seconds = run_processes(nodes, lambda node: _torch_join(port, nodes, join_timeout))
    finally:
        os.kill(server, signal.SIGKILL)
        os.waitpid(server, 0)
    failures = [outcome for outcome in outcomes if outcome]
    return Startup(nodes, nodes - len(failures), seconds, 0, failures[0] if failures else "")


def torch_in_fresh_processes(nodes: int, join_timeout: float) -> Startup:
    """``torch_in_processes`` forked from a fresh interpreter: forked from this one after an earlier N had run, torch's
    rendezvous did not meet at 32 nodes, where it met in 1.3 s from a fresh one (the cause was not found)."""
    code = (
        "import json, sys, dataclasses; from benchmarks import scale; scale.raise_open_files_limit();"
        f" print(json.dumps(dataclasses.asdict(scale.torch_in_processes({nodes}, {join_timeout}))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return Startup(**json.loads(done.stdout.strip().splitlines()[-1]))


def raise_open_files_limit() -> None:
    """Every simulated node holds a few sockets in this one process."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def table(figures: dict) -> str:
    """The figures of ``main`` as a Markdown table (and the firewall case below it)."""
    by_n = {key: {startup.nodes: startup for startup in figures[key]} for key in STARTUPS}
    lines = [
        "| nodes | template, threads: met in (s) | torch c10d, threads | template, processes | torch c10d, processes |"
        " connections per node | store requests/s per node | failure known to all (s) | beats read by all (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for load in figures["training"]:
        cells = [_met(by_n[key].get(load.nodes)) for key in STARTUPS]
        connections = by_n["threads"][load.nodes].connections_per_node
        lines.append(
            f"| {load.nodes} | {' | '.join(cells)} | {connections} | {load.requests_per_node_s:.2f} |"
            f" {load.failure_woke_all_s:.3f} | {load.beats_read_by_all_s:.2f} |"
        )
    if figures["agreement"]:
        agreements = ", ".join(f"{n} nodes {seconds * 1e3:.1f} ms" for n, seconds in figures["agreement"].items())
        lines += ["", f"The preemption agreement (a gloo all-reduce of a flag per rank, threads), median: {agreements}"]
    if figures["firewall"]:
        lines += [
            "",
            f"One node behind a firewall (its data port refuses): every node ended with: {figures['firewall']}",
        ]
    return "\n".join(lines) + "\n"


def _met(startup: Startup | None) -> str:
    if startup is None:
        return "-"
    if startup.met < startup.nodes:
        return f"**{startup.met} of {startup.nodes}** in {startup.seconds:.0f} s"
    return f"{startup.seconds:.2f}"


def plot(figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    figure, (startup_axis, load_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, style in zip(STARTUPS, ("o-", "s--", "o:", "s:"), strict=True):
        met = [startup for startup in figures[key] if startup.met == startup.nodes]
        line = startup_axis.plot([s.nodes for s in met], [s.seconds for s in met], style, label=STARTUPS[key])[0]
        for startup in figures[key]:
            if startup.met < startup.nodes:
                startup_axis.plot([startup.nodes], [startup.seconds], "x", color=line.get_color(), markersize=10)
    startup_axis.set(xscale="log", yscale="log", xlabel="nodes", ylabel="seconds until every node met")
    startup_axis.set_title("start-up (x: did not meet within the join timeout)")
    startup_axis.legend(fontsize=8)
    training = figures["training"]
    nodes = [load.nodes for load in training]
    load_axis.plot(nodes, [load.requests_per_node_s for load in training], "o-", label="store requests/s per node")
    load_axis.plot(nodes, [load.failure_woke_all_s for load in training], "^-", label="failure known to all (s)")
    load_axis.plot(nodes, [load.beats_read_by_all_s for load in training], "v-", label="beats read by all (s)")
    load_axis.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    load_axis.set(xscale="log", xlabel="nodes", title="while training, and at a failure (threads)")
    load_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=list(NODES))
    parser.add_argument("--torch-timeout", type=float, default=60.0, help="torch's join timeout, seconds (0: skip)")
    parser.add_argument("--seconds", type=float, default=6.0, help="of training load measured per N")
    parser.add_argument("--firewall", type=int, default=128, help="nodes of the firewall case (0: none)")
    parser.add_argument("--output", type=Path, default=FIGURES, help="writes OUTPUT.md, .json, .png")
    parser.add_argument("--processes-up-to", type=int, default=256, help="also as processes, up to this N")
    parser.add_argument("--agreement-up-to", type=int, default=64, help="the preemption agreement, up to this N")
    parser.add_argument("--in-place", action="store_true", help="in this network namespace (see own_network)")
    args = parser.parse_args(argv)
    if not args.in_place and os.environ.get(ISOLATED_VAR) != "1":
        return own_network(sys.argv[1:] if argv is None else argv)
    raise_open_files_limit()
    figures: dict = {key: [] for key in (*STARTUPS, "training")}
    for nodes in (n for n in args.nodes if n <= args.processes_up_to):  # forks first: no thread of ours exists yet
        figures["processes"].append(startup_in_processes(nodes))
        if args.torch_timeout:
            figures["torch processes"].append(torch_in_fresh_processes(nodes, args.torch_timeout))
    for nodes in args.nodes:  # the two rendezvous alternate at each N
        startup, store = measure_startup(nodes)
        del store
        figures["threads"].append(startup)
        if args.torch_timeout:
            figures["torch threads"].append(measure_torch(nodes, args.torch_timeout))
        figures["training"].append(measure_training(nodes, args.seconds))
        print(json.dumps({"startup": asdict(startup), "training": asdict(figures["training"][-1])}), flush=True)
    figures["agreement"] = {n: measure_agreement(n) for n in args.nodes if n <= args.agreement_up_to}
    figures["firewall"] = ""
    if args.firewall:
        startup, _ = measure_startup(args.firewall, firewalled=args.firewall // 2 + 1)
        figures["firewall"] = f"{args.firewall} nodes, node {args.firewall // 2 + 1} refusing: {startup.failure}"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(figures, default=asdict, indent=1) + "\n")
    text = table(figures)
    args.output.with_suffix(".md").write_text(text)
    plot(figures, args.output.with_suffix(".png"))
    print(text)
    return 0


def own_network(argv: list[str]) -> int:
    """Runs this command again in a network namespace of its own, with loopback only.

    torch's store looks up the name of every peer's address (reverse DNS) for its log lines, on both ends of each
    connection; this machine's resolver leaves some queries unanswered for its 5 s timeout (one in 10 to 25 here), so
    one connection in 10 to 25 took 5 s more, whatever the code under test. Without a resolver, the lookup fails at
    once, as a node's resolver that answers would. Needs root, or unprivileged user namespaces."""
    script = 'ip link set lo up && exec "$@"'
    command = [sys.executable, "-m", "benchmarks.scale", *argv]
    env = {**os.environ, ISOLATED_VAR: "1", "PYTHONPATH": str(LIBRARY)}
    for unshare in (["unshare", "--net"], ["unshare", "--net", "--map-root-user"]):
        probe = subprocess.run([*unshare, "true"], capture_output=True)
        if probe.returncode == 0:
            return subprocess.run([*unshare, "sh", "-c", script, "sh", *command], env=env, cwd=REPO).returncode
    print("no network namespace could be made (not root?): measuring in this one", file=sys.stderr)
    return subprocess.run(command, env=env, cwd=REPO).returncode


if __name__ == "__main__":
    sys.exit(main())
