"""Who listens where: the listening TCP and unix sockets of a process group, read from /proc (Linux only).

The local runner starts every instance in its own session, so an instance's processes (epd-launch's exec'd
server, vLLM's engine core) are the members of one process group, and each socket they hold is a
`socket:[inode]` link under /proc/<pid>/fd that /proc/net/{tcp,tcp6,unix} describe.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

TCP_LISTEN = "0A"
"""st of a listening socket in /proc/net/tcp (TCP_LISTEN)."""
UNIX_ACCEPTCON = 0x10000
"""__SO_ACCEPTCON in /proc/net/unix's Flags: the socket listens."""


@dataclass(frozen=True)
class TcpListener:
    pid: int
    address: str
    port: int

    @property
    def all_interfaces(self) -> bool:
        return ipaddress.ip_address(self.address).is_unspecified


def group_pids(leader: int) -> set[int]:
    """Every live process whose process group is `leader`'s."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == leader:  # state, ppid, pgrp
                pids.add(int(entry.name))
    return pids


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    address = ipaddress.IPv6Address(words)
    return str(address.ipv4_mapped or address)


def tcp_listeners(pids: set[int]) -> list[TcpListener]:
    """The TCP sockets these processes listen on (IPv4 and IPv6)."""
    owner = {inode: pid for pid in pids for inode in socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            local, state, inode = cols[1], cols[3], int(cols[9])
            if state == TCP_LISTEN and inode in owner:
                host, port = local.split(":")
                found.append(TcpListener(owner[inode], _address(host), int(port, 16)))
    return found


def unix_listeners(pids: set[int]) -> dict[str, int]:
    """Path -> pid of the unix sockets these processes listen on (abstract ones start with @)."""
    owner = {inode: pid for pid in pids for inode in socket_inodes(pid)}
    found = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and int(cols[3], 16) & UNIX_ACCEPTCON and int(cols[6]) in owner:
            found[cols[7]] = owner[int(cols[6])]
    return found
