"""The network interface a multi-node run talks on: the one on the route to MASTER_ADDR, unless the user names one.

gloo binds the address this host's name resolves to unless ``GLOO_SOCKET_IFNAME`` names an interface, and NCCL takes
the first interface that is not loopback or docker unless ``NCCL_SOCKET_IFNAME`` does. On many machines the hostname
resolves to 127.0.0.1 (/etc/hosts in cloud images and containers), and a node then tells its peers to reach it at
127.0.0.1: they connect to themselves and the run hangs (docs/multi-node.md). The interface the kernel uses to reach
MASTER_ADDR is the one every node can be reached on, so that is the one the template names, for both backends.
"""

import fcntl
import socket
import struct
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# Interfaces no other node reaches this one on: loopback, and the bridges and pairs of containers and VMs.
LOCAL_ONLY_PREFIXES = ("lo", "docker", "br-", "veth", "virbr", "cni", "flannel", "cali")
OUTSIDE = "203.0.113.1"  # TEST-NET-3 (RFC 5737): a UDP connect to it sends nothing and shows the default route
_SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address


class InterfaceError(ValueError):
    """A named interface that does not exist or has no address: refused before anything starts."""


@dataclass(frozen=True)
class Interface:
    name: str
    address: str | None  # its IPv4 address (IPv6 where it has none); None: it has no address


def interfaces() -> list[Interface]:
    """This host's network interfaces with their addresses, in the kernel's order."""
    return [Interface(name, interface_address(name)) for _, name in socket.if_nameindex()]


def interface_address(name: str) -> str | None:
    """NAME's IPv4 address, else its first IPv6 one (Linux), else None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            return socket.inet_ntoa(packed[20:24])
        except OSError:
            pass
    return _ipv6_addresses().get(name)


def _ipv6_addresses() -> dict[str, str]:
    try:
        with open("/proc/net/if_inet6") as table:
            rows = [line.split() for line in table]
    except OSError:
        return {}
    addresses: dict[str, str] = {}
    for row in rows:
        hexed, name = row[0], row[-1]
        addresses.setdefault(name, socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hexed)))
    return addresses


def source_address(host: str, port: int) -> str:
    """The address this host would send from to reach HOST (a UDP connect sends nothing: the kernel picks the route).
    Raises OSError when HOST does not resolve or no route leads to it."""
    family, kind, proto, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.connect(target)
        return probe.getsockname()[0]


def route_interface(host: str, port: int) -> Interface | None:
    """The interface on the route to HOST, or None where it cannot be told (an address on no interface)."""
    address = source_address(host, port)
    return next((each for each in interfaces() if each.address == address), None)


def listing() -> str:
    return ", ".join(f"{each.name} ({each.address or 'no address'})" for each in interfaces())


def check_named(variable: str, value: str) -> None:
    """Refuses an interface VARIABLE names that does not exist or has no address, naming those that do.

    gloo takes a comma-separated list of names; NCCL takes prefixes, ``=name`` for an exact name and ``^`` to exclude,
    so only an exact NCCL name is checked.
    """
    if variable == "NCCL_SOCKET_IFNAME":
        if not value.startswith("="):
            return
        names = [name.strip() for name in value[1:].split(",")]
    else:
        names = [name.strip() for name in value.split(",")]
    present = {each.name: each for each in interfaces()}
    for name in names:
        if name not in present:
            raise InterfaceError(f"{variable}={value}: this host has no interface {name!r}; it has {listing()}")
        if present[name].address is None:
            raise InterfaceError(f"{variable}={value}: interface {name!r} has no address; this host has {listing()}")


def check_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Checks the interfaces ENVIRON names (raises ``InterfaceError``); returns the variables that name one."""
    named = {variable: environ[variable] for variable in INTERFACE_VARS if environ.get(variable)}
    for variable, value in named.items():
        check_named(variable, value)
    return named


def choose_interface(environ: MutableMapping[str, str], host: str, port: int, pick: bool = True) -> str | None:
    """Checks the interfaces the user named; where they named none and PICK (the run spans nodes), sets both
    variables in ENVIRON to the interface on the route to HOST and returns a line saying so (else None)."""
    if check_environment(environ) or not pick or not sys.platform.startswith("linux"):
        return None
    try:
        interface = route_interface(host, port)
    except OSError:  # unresolvable or unreachable: the rendezvous says so, measured (runtime/rendezvous.py)
        return None
    if interface is None:
        return None
    why = f"the interface on the route to MASTER_ADDR {host}"
    # Node 0, by a name that resolves to 127.0.0.1 here (not 127.0.0.1 itself: every node on this host, lo is right).
    if is_loopback(interface.address) and not (is_loopback(host) or host.startswith("localhost")):
        interface, how = outward_interface()
        if interface is None:
            return None  # the start-up's probes name the loopback address, with the fix (runtime/rendezvous.py)
        why = f"{how} (MASTER_ADDR {host} is this host, by a name that resolves to a loopback address here)"
    for variable in INTERFACE_VARS:
        environ[variable] = interface.name
    choose = "set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to choose another"
    return f"network: {interface.name} ({interface.address}), {why} ({choose})"


def is_loopback(address: str | None) -> bool:
    return bool(address) and (address.startswith("127.") or address == "::1")


def outward_interface() -> tuple[Interface | None, str]:
    """The interface other nodes reach this host on, where MASTER_ADDR cannot tell: the default route's, else the
    first that is neither loopback nor a container's or VM's; with how it was chosen."""
    try:
        default = route_interface(OUTSIDE, 9)
    except OSError:  # no default route
        default = None
    if default is not None and not is_loopback(default.address):
        return default, "the interface on the default route"
    candidates = [each for each in interfaces() if each.address and not each.name.startswith(LOCAL_ONLY_PREFIXES)]
    return (candidates[0] if candidates else None), "the first interface that is not loopback or a container's"
