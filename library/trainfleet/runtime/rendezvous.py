"""Start-up: every process of a run meets the others within a start-up timeout of its own, and a network fault ends
every rank with what was measured, never a hang.

torch's rendezvous waits for the process group's timeout (30 minutes by default, the one training's collectives use
too), and what fails inside it reads as "Connection refused", a store timeout, or nothing at all: gloo and NCCL
connect the ranks to each other in C++ after the rendezvous, on addresses the user never sees. So before the process
group forms, through the same TCP store it will use (public torch API), the ranks check what commonly goes wrong:

1. MASTER_ADDR resolves and answers at MASTER_PORT (no route, no answer, refused: each measured, with its fix);
2. every global rank arrives once (a node that never comes is named; two nodes with one NODE_RANK are refused);
3. every node runs the same thing (template, torch and Lightning versions, the resolved config);
4. the nodes reach each other on the interface training will use, on another port than MASTER_PORT (a firewall that
   lets the rendezvous through but not the data connections): each node probes the next on a ring, so a node the
   others cannot reach is named by the one before it.

Written for thousands of nodes: each rank makes a fixed number of store requests whatever the world size, waits in
the store (its server answers when the awaited key is set) instead of polling it, and each node opens one probe and
accepts one (``doctor`` probes every pair). 1,024 simulated nodes meet in about 2 s on 2 cores
(``python -m benchmarks.scale``, docs/multi-node.md).

The store then serves the process group, with the training timeout.
"""

import contextlib
import errno
import hashlib
import importlib.util
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import metadata
from pathlib import Path

import lightning
import torch
import torch.distributed as dist

from trainfleet import program
from trainfleet.exit_codes import CRASHED_EXIT_CODE, REFUSED_EXIT_CODE
from trainfleet.messages import first_line, report
from trainfleet.runs.restarts import warm_generation
from trainfleet.runtime import network

REFUSED = REFUSED_EXIT_CODE  # a setting that cannot work: restarting would end the same way
# The network did not let the ranks meet: may be transient, and the launchers' restarts may retry it.
UNREACHED = CRASHED_EXIT_CODE
RETRY_S, RETRY_MAX_S = 0.1, 2.0  # between connection attempts to a store not listening yet
LINGER_S = 5.0
PROBE_S = 5.0  # a data connection that has not opened in this long is dropped on the way
NOTICE_S = 2.0  # rank 0 says whom it waits for once the others are this late
PROBES_PER_NODE = 1  # data connections each node opens at start-up (and accepts): the next nodes on a ring
# The store's key space for the process group, apart from the start-up's.
PROCESS_GROUP_KEYS = "project/process_group"
NODE_LOCAL_KEYS = (
    "config",
    "default_root_dir",
    "save_dir",
    "dirpath",
    "ckpt_path",
)  # paths: each node may have its own disk


class StartupFailed(RuntimeError):
    """The ranks could not meet; the message says what was measured and the fix. Reported once per node."""

    def __init__(self, message: str, exit_code: int = UNREACHED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Member:
    """This process's place in the run."""

    rank: int
    world: int
    node_rank: int
    local_rank: int
    nodes: int
    facts: dict[str, str] = field(default_factory=dict)  # what every node must agree on (``run_facts``)
    every_pair: bool = False  # probe every other node (the doctor's full check), not only the ring's next ones

    @property
    def per_node(self) -> int:
        return max(self.world // max(self.nodes, 1), 1)


def run_facts(config: dict[str, object] | None = None) -> dict[str, str]:
    """What every node must share: versions, the template's code, and the resolved CONFIG (flattened, node-local
    paths left out)."""
    facts = {
        "torch version": torch.__version__,
        "lightning version": lightning.__version__,
        "template version": _template_version(),
    }
    for key, value in (config or {}).items():
        if key.rsplit(".", 1)[-1] not in NODE_LOCAL_KEYS:
            facts[f"config {key}"] = json.dumps(value, sort_keys=True, default=str)
    return facts


def _template_version() -> str:
    """The project's and the library's versions and a digest of both packages' code: two checkouts of one version may
    still differ."""
    digest, versions = hashlib.sha1(), []
    for name in (program.package, "trainfleet"):
        spec = importlib.util.find_spec(name)
        for path in sorted(Path(spec.origin).parent.rglob("*.py")) if spec and spec.origin else ():
            digest.update(path.read_bytes())
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} unknown")
    return f"{', '.join(versions)} ({digest.hexdigest()[:12]})"


def meet(address: str, port: int, member: Member, timeout: timedelta) -> dist.Store:
    """Starts or reaches the run's TCP store at ADDRESS:PORT (rank 0 starts it), checks everything above within
    TIMEOUT, and returns the store for the process group. Raises ``StartupFailed`` on every rank otherwise."""
    deadline = time.monotonic() + timeout.total_seconds()
    store = open_store(address, port, member, timeout, serve=member.rank == 0)
    try:
        check_members(store, member, deadline, f"{address}:{port}")
    except StartupFailed as error:
        if member.rank == 0:
            _linger(store, member)
        # NODE_RANK 0 on the wrong host, or MASTER_ADDR wrong
        if member.rank == 0 and not _is_local(_resolve(address, port)):
            raise StartupFailed(
                f"{error}; and MASTER_ADDR {address} is not an address of this host ({socket.gethostname()}), which"
                " started as NODE_RANK 0: it must be node 0's own address",
                error.exit_code,
            ) from None
        raise
    return store


def open_store(address: str, port: int, member: Member, timeout: timedelta, serve: bool) -> dist.Store:
    """Step 1 above: the TCP store at ADDRESS:PORT, served by this process if SERVE (rank 0), reached within TIMEOUT
    otherwise; raises ``StartupFailed`` saying what was measured."""
    deadline = time.monotonic() + timeout.total_seconds()
    ip = _resolve(address, port)
    if serve:  # listens on every address; connects to itself at MASTER_ADDR if that is its own
        return _serve(ip if _is_local(ip) else "127.0.0.1", port, member.world, timeout)
    _reach(address, ip, port, deadline, member)
    return _connect(address, port, member.world, deadline)


def _linger(store: dist.Store, member: Member) -> None:
    """Rank 0 serves the store: it waits (a few seconds at most) for the ranks that came to read why they end."""
    startup = dist.PrefixStore("project/startup", store)
    if startup.add("ended", 0) < startup.add("connected", 0) - 1:
        _wait(startup, "gate/ended", LINGER_S)


def _ended(store: dist.Store) -> None:
    """This rank has read why the start-up failed; the last one to do so lets rank 0's store go (``_linger``)."""
    if store.add("ended", 1) >= store.add("connected", 0) - 1:
        store.set("gate/ended", "1")


def _is_local(ip: str) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as probe:
        try:
            probe.bind((ip, 0))
            return True
        except OSError:
            return False


def join(
    address: str, port: int, member: Member, timeout: timedelta, say: Callable[[str], None] = report
) -> dist.Store:
    """The store the ranks met in (under torchrun the agent's, ``attempt_store``, where torchrun's own rendezvous has
    gathered the nodes; elsewhere the one rank 0 starts, ``meet``): the process group forms in it under the key space
    ``PROCESS_GROUP_KEYS``."""
    choice = _choose_interface(address, port, pick=member.nodes > 1)
    if choice and member.local_rank == 0:
        say(choice)
    store = attempt_store(timeout)
    if store is None:
        store = meet(address, port, member, timeout)
    else:
        check_members(store, member, time.monotonic() + timeout.total_seconds(), f"{address}:{port}")
    return store


def attempt_store(timeout: timedelta) -> dist.Store | None:
    """The store a launcher keeps for every attempt (torchrun's agent's, or the warm restarts' supervisors':
    runtime/warm_restart.py), under this attempt's prefix (``attempt_prefix``); None where each attempt has its own.

    torch 2.14's agent keeps one store for every attempt, and no longer prefixes the ranks' keys by attempt: after a
    restart, a rank could read the address a killed rank had published ("Gloo connectFullMesh failed ... Connection
    refused", seen when the new ranks started a few seconds apart) and fail the restart.
    """
    prefix = attempt_prefix()
    return None if prefix is None else dist.PrefixStore(prefix, client_store(timeout))


def client_store(timeout: timedelta) -> dist.Store:
    """A client of the store at this process's MASTER_ADDR:MASTER_PORT (its launcher's, or rank 0's)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)


def attempt_prefix() -> str | None:
    """This attempt's key space in a store kept for every attempt: torchrun's restarts, then warm restarts within
    each; None where the store is the attempt's own (rank 0 serves it)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return f"/project/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}.{warm_generation()}"


def check_members(store: dist.Store, member: Member, deadline: float, where: str) -> None:
    """Steps 2-4 above, through STORE (which torchrun's agent may have started): raises ``StartupFailed``.

    Each rank makes a fixed number of store requests, whatever the world size, and waits in the store (the server
    wakes it) instead of polling; each node opens one probe connection and accepts one (its neighbour's on a ring)."""
    store = dist.PrefixStore("project/startup", store)
    listener = Listener() if member.local_rank == 0 else None
    try:
        _arrive(store, member, listener)
        _wait_for_all(store, member, deadline, where)
        verdict = _disagreement(store, member) or (_probe_neighbour(store, member, deadline) if listener else "")
        _agree_on_verdicts(store, member, verdict, deadline, where)
    except StartupFailed:
        if member.rank != 0:
            with contextlib.suppress(RuntimeError):  # the store's host may be gone already
                _ended(store)
        raise
    finally:
        if listener is not None:
            listener.close()


def _choose_interface(address: str, port: int, pick: bool) -> str | None:
    try:
        return network.choose_interface(os.environ, address, port, pick)
    except network.InterfaceError as error:
        raise StartupFailed(str(error), REFUSED) from None


def _resolve(address: str, port: int) -> str:
    try:
        return socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as error:
        raise StartupFailed(
            f"MASTER_ADDR {address!r} does not resolve on this host ({socket.gethostname()}):"
            f" {error.strerror or error}; set it to node 0's address or a name every node resolves",
            REFUSED,
        ) from None


def _serve(address: str, port: int, world: int, timeout: timedelta) -> dist.Store:
    try:
        return dist.TCPStore(address, port, world, is_master=True, timeout=timeout, wait_for_workers=False)
    except RuntimeError as error:
        in_use = "address already in use" in str(error).lower()
        what = f"port {port} is already in use on this host" if in_use else first_line(error)
        raise StartupFailed(
            f"node 0 cannot listen at MASTER_PORT {port}: {what}; choose a free port, the same on every node",
            REFUSED if in_use else UNREACHED,
        ) from None


def _reach(address: str, ip: str, port: int, deadline: float, member: Member) -> None:
    """Connects to the store's port until it answers or the deadline passes; says why it never did."""
    last: OSError | None = None
    pause = RETRY_S
    while True:
        try:
            socket.create_connection((ip, port), timeout=max(min(PROBE_S, _left_s(deadline)), 0.1)).close()
            return
        except OSError as error:  # an error the kernel named says more than a timeout cut short by the deadline
            last = error if error.errno or last is None or not last.errno else last
        if _left_s(deadline) <= 0:
            break
        time.sleep(min(pause, max(_left_s(deadline), 0)))
        pause = min(pause * 2, RETRY_MAX_S)  # node 0 not up yet: back off, so a thousand nodes do not hammer it
    raise StartupFailed(_unreached(address, ip, port, last, member, deadline), UNREACHED)


def _connect(address: str, port: int, world: int, deadline: float) -> dist.Store:
    """The store's client, built on a thread: torch's waits for the store's handshake with no timeout, forever when
    another program holds the port. A daemon thread, not an executor's: one left blocked must not hold up the exit."""
    built: list[dist.Store | BaseException] = []

    def build() -> None:
        try:
            built.append(dist.TCPStore(address, port, world, is_master=False, timeout=_left(deadline)))
        except BaseException as error:  # handed to the main thread
            built.append(error)

    builder = threading.Thread(target=build, name=f"{threading.current_thread().name}-connect", daemon=True)
    builder.start()
    builder.join(max(_left_s(deadline), 1.0))
    if not built:
        raise StartupFailed(
            f"something at MASTER_ADDR {address}, MASTER_PORT {port} accepts connections but never answered as the"
            " run's rendezvous: another program holds that port on node 0; choose a free port, the same on every node",
            REFUSED,
        )
    if isinstance(built[0], BaseException):
        raise StartupFailed(f"the rendezvous at {address}:{port} failed: {first_line(built[0])}", UNREACHED)
    return built[0]


def _unreached(address: str, ip: str, port: int, error: OSError | None, member: Member, deadline: float) -> str:
    where = f"MASTER_ADDR {address}" + (f" ({ip})" if ip != address else "") + f", MASTER_PORT {port}"
    code = getattr(error, "errno", None)
    loopback = network.is_loopback(ip)
    if code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN):
        measured = f"no route to it ({os.strerror(code)})"
        fix = "MASTER_ADDR must be node 0's address on a network this node is on (`ip route get` it)"
    elif code == errno.ECONNREFUSED:
        measured = "the host answers but nothing listens at that port (connection refused)"
        fix = "start node 0 (NODE_RANK=0), and give every node the same MASTER_PORT" + (
            "; MASTER_ADDR is a loopback address: on several hosts it must be node 0's own address" if loopback else ""
        )
    else:
        measured = "no answer (connections time out: a firewall drops the port, or the host is down)"
        fix = f"open TCP port {port} on node 0 to the other nodes, and check that node 0 is up"
    return (
        f"node {member.node_rank} (rank {member.rank}, host {socket.gethostname()}) could not reach the rendezvous at"
        f" {where} within the start-up timeout: {measured}; {fix}"
    )


class Listener:
    """A socket on the address this node's data connections will use, on a port of the kernel's choosing, accepting
    (and closing) what a neighbour's probe opens: a listener that never accepts drops connections beyond its backlog,
    which reads as a firewall."""

    def __init__(self) -> None:
        address = _data_address()
        self.socket = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind((address, 0))
        self.socket.listen(128)  # a burst of the doctor's probes waits here for the accepting thread
        threading.Thread(target=self._accept, name="rendezvous-probe-listener", daemon=True).start()

    def address(self) -> list:
        return list(self.socket.getsockname()[:2])

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:  # closed: the start-up is over
                return
            connection.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux); close() alone does not
        self.socket.close()


def _data_address() -> str:
    """The address gloo will tell the other ranks: its interface's, else the one this host's name resolves to."""
    names = (os.environ.get("GLOO_SOCKET_IFNAME") or "").split(",")
    named = network.interface_address(names[0].strip()) if names[0].strip() else None
    if named:
        return named
    try:
        return socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return "127.0.0.1"


def _arrive(store: dist.Store, member: Member, listener: Listener | None) -> None:
    host = socket.gethostname()
    store.add("connected", 1)  # rank 0 waits for as many to end before its store goes (``_linger``)
    claims = store.add(f"claim/{member.rank}", 1)
    if claims > 1:
        store.set(f"claim/{member.rank}/{claims}", host)
        first = store.get(f"claim/{member.rank}/1").decode()
        message = (
            f"two processes started as global rank {member.rank}: NODE_RANK {member.node_rank} is set on two nodes"
            f" ({first} and {host}); give each node its own NODE_RANK, 0 to {member.nodes - 1}"
        )
        _fail(store, REFUSED, message)
        raise StartupFailed(message, REFUSED)
    store.set(f"claim/{member.rank}/1", host)
    record = {"host": host, "node": member.node_rank, "facts": _digest(member.facts)}
    if member.rank == 0:  # the facts every other rank compares its own with, read only where they differ
        store.set("facts/0", json.dumps(member.facts))
    if listener is not None:
        record["probe"] = listener.address()
    store.set(f"member/{member.rank}", json.dumps(record))
    store.append("arrivals", f"{member.rank},")  # one record of who came, read only to name who did not
    if store.add("arrived", 1) == member.world:
        store.set("gate/arrived", "1")


def _wait_for_all(store: dist.Store, member: Member, deadline: float, where: str) -> None:
    """Waits in the store until the last rank has arrived; rank 0 says whom it waits for once the others are late (a
    node started by hand elsewhere)."""
    notice = None
    if member.rank == 0:
        notice = threading.Timer(NOTICE_S, _notice_absent, args=(store, member, where))
        notice.daemon = True
        notice.start()
    try:
        arrived = _wait(store, "gate/arrived", _left_s(deadline))
    finally:
        if notice is not None:
            notice.cancel()
    _raise_if_failed(store)
    if not arrived:
        _missing(store, member, where)


def _notice_absent(store: dist.Store, member: Member, where: str) -> None:
    with contextlib.suppress(RuntimeError):  # a store gone meanwhile: the waiting main thread says so
        store = store.clone()  # a connection of its own: the main thread's is held by its wait
        if not store.check(["gate/arrived"]):
            report(f"rendezvous at {where}: waiting for {_absent(store, member)}, up to the start-up timeout")


def _absent(store: dist.Store, member: Member) -> str:
    """The ranks not arrived yet, with their nodes, in words (one read of the arrivals' record)."""
    arrivals = store.get("arrivals").decode() if store.check(["arrivals"]) else ""
    arrived = {int(rank) for rank in arrivals.split(",") if rank}
    absent = [rank for rank in range(member.world) if rank not in arrived]
    nodes = sorted({rank // member.per_node for rank in absent})
    listed = ", ".join(map(str, absent[:8])) + (" ..." if len(absent) > 8 else "")
    node_words = "node rank " + ", ".join(map(str, nodes)) if len(nodes) < 9 else f"{len(nodes)} nodes"
    return f"{node_words} (rank {listed} of {member.world} missing)"


def _missing(store: dist.Store, member: Member, where: str) -> None:
    message = (
        f"{_absent(store, member)} never joined the rendezvous at {where} within the start-up timeout: start the"
        f" same command there with its NODE_RANK, the same MASTER_ADDR and MASTER_PORT, and num_nodes x devices ="
        f" {member.world}"
    )
    raise StartupFailed(message, UNREACHED)


def _disagreement(store: dist.Store, member: Member) -> str:
    """What this rank runs differently from rank 0, in words ("" when nothing): digests compared, facts read only
    where they differ."""
    if member.rank == 0:
        return ""
    theirs = json.loads(store.get("member/0"))
    if _digest(member.facts) == theirs["facts"]:
        return ""
    their_facts = json.loads(store.get("facts/0"))
    differ = sorted(
        key for key in set(member.facts) | set(their_facts) if member.facts.get(key) != their_facts.get(key)
    )
    shown = "; ".join(
        f"{key}: {their_facts.get(key, '(none)')} there, {member.facts.get(key, '(none)')} here" for key in differ[:3]
    )
    more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
    return json.dumps(
        [
            REFUSED,
            f"node {member.node_rank} ({socket.gethostname()}) runs something else than node 0 ({theirs['host']}):"
            f" {shown}{more}; start every node from the same checkout, environment and config",
        ]
    )


def _digest(facts: dict[str, str]) -> str:
    return hashlib.sha1(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def neighbours(node: int, nodes: int, count: int = PROBES_PER_NODE) -> list[int]:
    """The nodes NODE probes: the next COUNT on a ring. Every node is probed by as many, so a node that the others
    cannot reach is named by its predecessor, whatever the number of nodes."""
    return sorted({(node + step) % nodes for step in range(1, count + 1)} - {node})


def _probe_neighbour(store: dist.Store, member: Member, deadline: float) -> str:
    """Opens a connection from this node to its neighbours' listeners (``neighbours``), what gloo and NCCL will do on
    other ports than MASTER_PORT; records each (``connections``) and returns the first failure in words ("" when
    none)."""
    opened = []
    count = member.nodes - 1 if member.every_pair else PROBES_PER_NODE
    for node in neighbours(member.node_rank, member.nodes, count):
        record = json.loads(store.get(f"member/{node * member.per_node}"))
        if "probe" not in record:
            continue
        host, port = record["probe"]
        seconds = max(min(PROBE_S, _left_s(deadline)), 0.5)
        start = time.perf_counter()
        try:
            socket.create_connection((host, port), timeout=seconds).close()
        except OSError as error:
            return json.dumps([UNREACHED, _unconnected(member, record, host, port, error, seconds)])
        opened.append(
            f"node {member.node_rank} ({socket.gethostname()}) -> node {record['node']} ({record['host']},"
            f" {host}:{port}): connected in {(time.perf_counter() - start) * 1e3:.1f} ms"
        )
    store.set(f"connections/{member.node_rank}", json.dumps(opened))
    return ""


def _unconnected(member: Member, record: dict, host: str, port: int, error: OSError, seconds: float) -> str:
    code = getattr(error, "errno", None)
    how = "refused" if code == errno.ECONNREFUSED else os.strerror(code) if code else f"no answer in {seconds:.0f} s"
    if network.is_loopback(host):
        fix = (
            f"node {record['node']} offers a loopback address, the one its hostname ({record['host']}) resolves to:"
            " set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME there to the interface the nodes share"
        )
    else:
        fix = (
            "the nodes reach each other at MASTER_PORT only, and gloo and NCCL connect on other, random ports: open TCP"
            " between the nodes (e.g. the firewall's rule for MASTER_PORT, for every port)"
        )
    return (
        f"node {member.node_rank} ({socket.gethostname()}) reached the rendezvous but not node {record['node']}"
        f" ({record['host']}) at {host}:{port}, where training's connections go ({how}); {fix}"
    )


def connections(store: dist.Store) -> list[str]:
    """The connections each node opened to the others at start-up, one line each (for ``doctor``)."""
    startup = dist.PrefixStore("project/startup", store)
    lines, node = [], 0
    while startup.check([f"connections/{node}"]):
        lines += json.loads(startup.get(f"connections/{node}"))
        node += 1
    return lines


def _agree_on_verdicts(store: dist.Store, member: Member, verdict: str, deadline: float, where: str) -> None:
    """Every rank ends with the first failure any rank found, or goes on once every rank has found none."""
    if verdict:
        _fail(store, *json.loads(verdict))
    if store.add("checked", 1) == member.world:
        store.set("gate/checked", "1")
    checked = _wait(store, "gate/checked", _left_s(deadline))
    _raise_if_failed(store)
    if not checked:
        _missing(store, member, where)


def _fail(store: dist.Store, code: int, message: str) -> None:
    """Records the start-up's failure (the first one written stands) and wakes every rank waiting at a gate."""
    store.compare_set("failed", "", json.dumps([code, message]))
    for gate in ("gate/arrived", "gate/checked"):
        store.set(gate, "1")


def _wait(store: dist.Store, key: str, seconds: float) -> bool:
    """Blocks until KEY is in STORE (the store's server answers when it is set: no polling) or SECONDS pass;
    whether it came."""
    if store.check([key]):
        return True
    if seconds <= 0:
        return False
    try:
        store.wait([key], timedelta(seconds=seconds))
    except dist.DistStoreError:  # the wait's timeout; a lost store raises DistNetworkError
        return store.check([key])
    return True


def _raise_if_failed(store: dist.Store) -> None:
    if store.check(["failed"]):
        code, message = json.loads(store.get("failed"))
        raise StartupFailed(message, code)


def _left_s(deadline: float) -> float:
    return deadline - time.monotonic()


def _left(deadline: float) -> timedelta:
    return timedelta(seconds=max(_left_s(deadline), 1.0))
