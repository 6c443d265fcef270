"""Several hosts on this machine, each with a network stack of its own: what crosses a real network between nodes.

Each host is a Linux network namespace with its own address (10.55.0.N/24), interface name and hostname (a UTS
namespace), all joined through a bridge in a "switch" namespace. Like many cloud images, each host's name resolves to
127.0.0.1 on itself, and the others' to their addresses (``/etc/netns/HOST/hosts``, which ``ip netns exec`` puts in
place of /etc/hosts); each has a decoy
interface named like a container bridge (``docker0``, 172.17.0.1/16) created first, so that "the first interface that
is not loopback" is the wrong one. Firewall rules come from nftables, inside a host. The hosts share this machine's
file system, like a cluster's shared one.

``hosts`` (module fixture in the tests) starts them; where they cannot start (not root, no ``ip``, no network
namespaces), the tests skip and say why. Needs root; ``nft`` is installed from the package manager when missing.
"""

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SUBNET = "10.55.0"
INTERFACE_NAMES = ("ens5", "enp2s0", "eth1")  # one name each: a setting copied from another host would not fit
NETNS_ETC = Path("/etc/netns")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Host:
    namespace: str
    name: str  # its hostname, resolving to 127.0.0.1 on it
    interface: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """ARGV run on this host: its network namespace, and a UTS namespace with its hostname."""
        script = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c", script, self.name, *argv]

    def daemon_command(self, argv: list[str]) -> list[str]:
        """ARGV on this host as a system daemon sees it: its network and UTS namespaces and its /etc/hosts, with this
        machine's /sys (``ip netns exec`` mounts one without the cgroup file systems slurmd needs)."""
        script = 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"'
        hosts_file = str(NETNS_ETC / self.namespace / "hosts")
        enter = ["nsenter", f"--net=/run/netns/{self.namespace}", "unshare", "--mount", "--uts"]
        return [*enter, "sh", "-c", script, self.name, hosts_file, *argv]

    def firewall(self, rules: str) -> None:
        """nftables RULES (the body of an ``inet`` table) on this host; replaces the rules set before."""
        subprocess.run(
            ["ip", "netns", "exec", self.namespace, "nft", "-f", "-"],
            input=f"table inet test\ndelete table inet test\ntable inet test {{\n{rules}\n}}\n",
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def clear_firewall(self) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.namespace, "nft", "delete", "table", "inet", "test"],
            capture_output=True,
            timeout=30,
        )


@dataclass
class Hosts:
    prefix: str
    hosts: list[Host] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def up(self, count: int) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for index in range(count):
            self.hosts.append(self._add_host(index))
        for host in self.hosts:  # a cluster's /etc/hosts: the others by address, itself on 127.0.0.1
            others = "".join(f"{other.address} {other.name}\n" for other in self.hosts if other is not host)
            (NETNS_ETC / host.namespace / "hosts").write_text(f"127.0.0.1 localhost {host.name}\n{others}")

    def _add_host(self, index: int) -> Host:
        host = Host(f"{self.prefix}h{index}", f"node{index}", INTERFACE_NAMES[index], f"{SUBNET}.{index + 1}")
        _ip("netns", "add", host.namespace)
        (NETNS_ETC / host.namespace).mkdir(parents=True, exist_ok=True)
        inside = ["-n", host.namespace]
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "link", "add", "docker0", "type", "bridge")  # the decoy, first after lo
        _ip(*inside, "addr", "add", "172.17.0.1/16", "dev", "docker0")
        _ip(*inside, "link", "set", "docker0", "up")
        ours, theirs = f"{self.prefix}v{index}", f"{self.prefix}p{index}"
        _ip("link", "add", ours, "type", "veth", "peer", "name", theirs)
        _ip("link", "set", ours, "netns", host.namespace)
        _ip("link", "set", theirs, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", theirs, "master", "br0", "up")
        _ip(*inside, "link", "set", ours, "name", host.interface)
        _ip(*inside, "addr", "add", f"{host.address}/24", "dev", host.interface)
        _ip(*inside, "link", "set", host.interface, "up")
        return host

    def down(self) -> None:
        for namespace in [host.namespace for host in self.hosts] + [self.switch]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
            shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)
        self.hosts.clear()


def cannot_start() -> str | None:
    """Why hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root: network namespaces (ip netns add) need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "no `ip` (iproute2) or `unshare` (util-linux) on this machine"
    if shutil.which("nft") is None:
        install = ["apt-get", "install", "-y", "-qq", "nftables"]
        if shutil.which("apt-get") is None or subprocess.run(install, capture_output=True, timeout=600).returncode:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
            if subprocess.run(install, capture_output=True, timeout=600).returncode:
                return "nftables is not installed and apt-get could not install it"
    return None


def start_hosts(count: int) -> Hosts:
    """COUNT hosts, up; raises RuntimeError with the reason when they cannot be made."""
    reason = cannot_start()
    if reason:
        raise RuntimeError(reason)
    hosts = Hosts(prefix=f"pmh{os.getpid() % 100000}")
    try:
        hosts.up(count)
    except subprocess.CalledProcessError as error:
        hosts.down()
        raise RuntimeError(f"network namespaces could not be made: {' '.join(error.cmd)}: {error.stderr}") from None
    return hosts


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """Three hosts for the module's tests (two-node runs use the first two); skipped with the reason where they
    cannot be made."""
    try:
        made = start_hosts(3)
    except RuntimeError as error:
        pytest.skip(f"multi-host tests need separate network namespaces: {error}")
    yield made
    made.down()
