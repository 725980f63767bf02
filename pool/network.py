"""Which addresses are loopback, and which Host names this server answers to (Django's
ALLOWED_HOSTS). Pure functions, and one that asks the machine for its names and addresses."""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; any other name is not (it may resolve anywhere)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host.strip() in WILDCARDS


def host_pattern(address: str) -> str:
    """An address as a Host header names it: IPv6 in brackets, without a zone (`%eth0`)."""
    address = address.strip("[]").split("%")[0].lower()
    return f"[{address}]" if ":" in address else address


def allowed_hosts(bind: str, extra: list[str], machine: list[str]) -> list[str]:
    """The Host names a server bound to `bind` answers to: loopback always, the bound address, and
    on a wildcard bind the machine's names and addresses (`machine`); then OMLX_ALLOWED_HOSTS
    (`extra`). A name outside the list (DNS rebinding: `evil.example` resolving to this machine)
    is refused by Django with a 400."""
    hosts = list(LOOPBACK_NAMES)
    if is_wildcard(bind):
        hosts += machine
    elif not is_loopback(bind):
        hosts += [host_pattern(bind), *[m for m in machine if not _is_address(m)]]
    elif host_pattern(bind) not in hosts:
        hosts.append(host_pattern(bind))
    hosts += extra
    return list(dict.fromkeys(hosts))


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return False


def machine_names() -> list[str]:
    """This machine's host names and the addresses of its interfaces, as Host headers name them."""
    import psutil

    names = []
    for name in (socket.gethostname(), socket.getfqdn()):
        name = name.lower().rstrip(".")
        if name:
            names += [name, name if name.endswith(".local") else f"{name}.local"]
    for addresses in psutil.net_if_addrs().values():
        names += [host_pattern(a.address) for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)]
    return list(dict.fromkeys(names))


def hosts_for(bind: str, extra: list[str]) -> list[str]:
    """allowed_hosts() for this machine (its names are looked up only for a non-loopback bind)."""
    return allowed_hosts(bind, extra, [] if is_loopback(bind) else machine_names())


def advertised_names(conf) -> list[str]:
    """The name in OMLX_ADVERTISE_URL: the other hosts of a fleet call this one by it."""
    from urllib.parse import urlsplit

    name = urlsplit(conf.advertise_url).hostname
    return [name] if name else []
