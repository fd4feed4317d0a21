"""Addresses: which one this process serves on towards a job's master."""
import ipaddress
import socket

from gradsync._lib import GradsyncError


def is_loopback(host):
    """Whether every address `host` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise GradsyncError("%s does not resolve: %s" % (host, e),
                            "unavailable")
    return all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def own_address(master):
    """This host's address towards `master`: 127.0.0.1 when `master` is a
    loopback address, else the source address the kernel would use to reach
    it (found by connecting a UDP socket, which sends nothing)."""
    if is_loopback(master):
        return "127.0.0.1"
    family, _, _, _, target = socket.getaddrinfo(
        master, 1, proto=socket.IPPROTO_UDP)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(target)
        return s.getsockname()[0]
