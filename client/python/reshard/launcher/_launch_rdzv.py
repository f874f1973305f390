"""Where a world of `reshard run` meets (docs/pytorch.md, "The launcher"):
MASTER_PORT from the world's layout epoch, MASTER_ADDR from the host of its
rank 0. Every launcher computes the same answer; no launcher talks to another.
"""

from reshard.core import errors
from reshard.core import layout as _layout
from reshard.launcher._launch_env import LaunchError

DEFAULT_PORT_RANGE = (29500, 30499)


def parse_port_range(text):
    """(lo, hi) from "lo-hi" (inclusive, 1 <= lo <= hi <= 65535)."""
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise LaunchError(f"--rdzv-port-range {text!r}: expected LO-HI, e.g. 29500-30499") from None
    if not 1 <= lo <= hi <= 65535:
        raise LaunchError(f"--rdzv-port-range {text!r}: need 1 <= LO <= HI <= 65535")
    return lo, hi


def rendezvous_port(epoch, port_range=DEFAULT_PORT_RANGE):
    """MASTER_PORT of the world of layout epoch `epoch` (Job.layout_epoch for
    the world of the job's current layout, + 1 for a stop-free operation's
    new world): the same on every host. Worlds alive at once have
    consecutive epochs, hence different ports (a range of at least 2)."""
    lo, hi = port_range
    return lo + int(epoch) % (hi - lo + 1)


def _host_part(address):
    """"host" of "host:port" / "[v6]:port"."""
    if address.startswith("["):
        return address[1:address.index("]")]
    return address.rsplit(":", 1)[0] if ":" in address else address


class Addresses:
    """MASTER_ADDR of a host id, the same answer on every launcher: an
    explicit --rdzv-host HOST=ADDR, else --rdzv-host-pattern with {host}
    (e.g. a StatefulSet's "{host}.trainers.ns.svc"), else the host part of
    the agent address the coordinator lists (ListHosts: a scheduler or
    viewer credential; a worker token may not list hosts)."""

    def __init__(self, explicit=None, pattern="", list_hosts=None):
        self.explicit = dict(explicit or {})
        self.pattern = pattern
        self._list_hosts = list_hosts
        self._listed = {}

    def of(self, host):
        if host in self.explicit:
            return self.explicit[host]
        if self.pattern:
            return self.pattern.format(host=host)
        if self._list_hosts is not None and host not in self._listed:
            try:
                self._listed = {h.host_id: _host_part(h.address) for h in self._list_hosts()
                                if h.address}
            except errors.PermissionDenied as e:
                raise LaunchError(
                    f"host \"{host}\": no --rdzv-host {host}=ADDR or --rdzv-host-pattern, and the "
                    f"coordinator does not list hosts to this credential ({e.message})") from None
        if host in self._listed:
            return self._listed[host]
        raise LaunchError(f"host \"{host}\": no address (give --rdzv-host {host}=ADDR or "
                          f"--rdzv-host-pattern)")


def master_addr(lay, host, addresses):
    """MASTER_ADDR of the world of layout `lay` as seen from `host`: the
    address of its rank 0's host (Addresses), or 127.0.0.1 when the whole
    world is on `host` (no other launcher needs to agree)."""
    slots = _layout.slots(lay)
    if all(h == host for h, _ in slots):
        return "127.0.0.1"
    return addresses.of(slots[0][0])
