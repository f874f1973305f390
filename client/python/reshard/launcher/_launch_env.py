"""The contract between `reshard run` and the ranks it starts
(docs/pytorch.md, "The launcher"): the environment of a rank (the launcher
writes it with rank_environment(), a rank reads it with rank_env()) and the
exit statuses. reshard.launch re-exports all of it; a rank needs nothing
else of the launcher.
"""

import dataclasses
import json
import os

from reshard.core._proto import as_message, ptc_pb2

# Exit statuses of `reshard run`.
EXIT_OK = 0            # the job was deleted
EXIT_RANK_FAILED = 1   # a rank failed and no recovery came in time
EXIT_USAGE = 2         # bad arguments or a credential the coordinator refuses
EXIT_JOB_FAILED = 3    # the job's state is lost beyond recovery (JOB_STATE_FAILED)

# A rank that exits with this status says it ended because a peer died (a
# collective failed: reshard.elastic.PeerLost), not by a fault of its own:
# the launcher stops its world's other ranks on this host but does not report
# it. (75 is sysexits' EX_TEMPFAIL.)
EXIT_PEER_LOST = 75


class LaunchError(Exception):
    """A launcher that cannot go on: bad arguments, an address it cannot
    find, a coordinator that refuses it. The message names the thing."""


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """What `reshard run` told a rank (rank_env() reads it)."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    coordinator: str
    job_id: str
    worker_token: str
    worker_socket: str
    generation: int        # the generation to load; 0 = a fresh start (publish generation 1)
    operation_id: str      # "" unless started in warm-up of a stop-free operation
    layout: object         # reshard.v1.Layout of this rank's world
    tls_ca: str = ""       # "" = the coordinator is plaintext (--insecure)
    device: int = 0        # the layout's device slot of this rank on its host

    @property
    def warm_up(self):
        """True for a rank of a stop-free operation's new layout: it warms
        up, then joins (reshard.elastic.join) instead of loading."""
        return bool(self.operation_id)

    @property
    def fresh(self):
        """True when there is nothing to load: the job's first ranks, which
        publish generation 1."""
        return self.generation == 0 and not self.operation_id

    def client(self, token=None, **kwargs):
        """A reshard.Client of the job's coordinator presenting `token`
        (default: the worker token), TLS with $RESHARD_TLS_CA when set."""
        from reshard.core.client import Client, tls_credentials
        if self.tls_ca:
            kwargs.setdefault("credentials", tls_credentials(self.tls_ca))
        else:
            kwargs.setdefault("insecure", True)
        return Client(self.coordinator, token=(token or self.worker_token) or None, **kwargs)

    def worker(self, ptc=None, **kwargs):
        """This rank's reshard.Worker (its host agent's worker socket)."""
        from reshard.core.worker import Worker
        return Worker(self.worker_socket, self.job_id, ptc=ptc, worker_token=self.worker_token,
                      **kwargs)


def _env_int(env, name):
    value = env.get(name)
    if value is None:
        raise LaunchError(f"${name} is not set: start the rank with `reshard run`")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"${name} {value!r}: not an integer") from None


def _env_str(env, name):
    value = env.get(name)
    if value is None:
        raise LaunchError(f"${name} is not set: start the rank with `reshard run`")
    return value


def rank_env(env=None):
    """The RankEnv of this process (from os.environ, or `env`). LaunchError
    names a variable that is missing or malformed."""
    env = os.environ if env is None else env
    try:
        lay = as_message(json.loads(_env_str(env, "RESHARD_LAYOUT")), ptc_pb2.Layout,
                         "RESHARD_LAYOUT")
    except (ValueError, TypeError) as e:
        raise LaunchError(f"$RESHARD_LAYOUT: not a layout: {e}") from None
    return RankEnv(
        rank=_env_int(env, "RANK"), world_size=_env_int(env, "WORLD_SIZE"),
        local_rank=_env_int(env, "LOCAL_RANK"), local_world_size=_env_int(env, "LOCAL_WORLD_SIZE"),
        master_addr=_env_str(env, "MASTER_ADDR"), master_port=_env_int(env, "MASTER_PORT"),
        coordinator=_env_str(env, "RESHARD_COORDINATOR"), job_id=_env_str(env, "RESHARD_JOB_ID"),
        worker_token=env.get("RESHARD_WORKER_TOKEN", ""),
        worker_socket=_env_str(env, "RESHARD_WORKER_SOCKET"),
        generation=_env_int(env, "RESHARD_GENERATION"),
        operation_id=env.get("RESHARD_OPERATION_ID", ""), layout=lay,
        tls_ca=env.get("RESHARD_TLS_CA", ""),
        device=int(env.get("RESHARD_DEVICE", "0") or 0))


def rank_environment(base, *, rank, world_size, local_rank, local_world_size, master_addr,
                     master_port, coordinator, job_id, worker_token, worker_socket, generation,
                     layout_json, device, operation_id="", tls_ca=""):
    """The environment of one rank that `reshard run` starts: `base` (the
    launcher's own) with torchrun's and reshard's variables, the ones rank_env()
    reads. RESHARD_OPERATION_ID and RESHARD_TLS_CA are left out when empty."""
    env = dict(base)
    env.pop("RESHARD_OPERATION_ID", None)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "RESHARD_COORDINATOR": coordinator, "RESHARD_JOB_ID": job_id,
        "RESHARD_WORKER_TOKEN": worker_token,
        "RESHARD_WORKER_SOCKET": worker_socket,
        "RESHARD_GENERATION": str(generation), "RESHARD_LAYOUT": layout_json,
        "RESHARD_DEVICE": str(device),
    })
    if operation_id:
        env["RESHARD_OPERATION_ID"] = operation_id
    if tls_ca:
        env["RESHARD_TLS_CA"] = tls_ca
    else:
        env.pop("RESHARD_TLS_CA", None)
    if local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does
    return env
