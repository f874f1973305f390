"""Faults of the change feed (issue 21; docs/coordinator.md, "Change
feed"), caused for real on a local cluster while a Client.watch_job stream
is open:

- the coordinator is SIGKILLed and started again, and a change commits
  while the watcher is between streams: the watcher resumes from the last
  version it saw and gets that change; killed again with nothing changing,
  the resumed stream repeats nothing: its first update is the next change;
- PostgreSQL is SIGKILLed and restarted under the coordinator: the open
  stream stays open and a change committed afterwards reaches it;
- a notification is lost (the job's announcing trigger disabled, so the
  commit sends none): the coordinator's safety poll still delivers it.

(The replica test of two coordinators, and the thread-free streams, are in
tests/coordinator/server/change_feed_server_test.cc.)"""

import os
import queue
import subprocess
import threading

import pytest

import faultlib
from cluster import _pg_bindir, scrape_metrics

# How long a watcher may take to see a change: far above a NOTIFY's
# delivery or a 1 s safety poll, far below any lease.
SEEN_WITHIN_S = 15.0


class Watcher:
    """Client.watch_job on a thread of its own; every job it yields is put
    on `jobs`, and the end of the iteration (or its exception) on `ended`."""

    def __init__(self, cluster, job_id, on_retry=None):
        self.jobs = queue.Queue()
        self.ended = queue.Queue()
        self._client = cluster.client(timeout=30.0, max_attempts=50, max_backoff=0.5)
        self._client.on_retry = on_retry
        self._iterator = self._client.watch_job(job_id)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            for job in self._iterator:
                self.jobs.put(job)
            self.ended.put(None)
        except Exception as e:  # noqa: BLE001: the test reads it
            self.ended.put(e)

    def next(self, timeout=SEEN_WITHIN_S):
        try:
            return self.jobs.get(timeout=timeout)
        except queue.Empty:
            ended = None if self.ended.empty() else self.ended.get()
            raise AssertionError(f"no job update within {timeout} s (stream ended: {ended!r})")

    def close(self):
        self._client.close()


def _rank_failure(client, job_id, rank):
    client.report_rank_failure(job_id, rank, reason=f"rank {rank} exited")


def _psql(cluster, sql):
    subprocess.run([os.path.join(_pg_bindir(), "psql"), cluster.dsn, "-v", "ON_ERROR_STOP=1",
                    "-q", "-c", sql], check=True, capture_output=True, timeout=30)


def _open_job_watches(cluster):
    """WatchJob streams the coordinator holds open (0 while it cannot say)."""
    try:
        metrics = scrape_metrics(cluster.coordinator_metrics)
    except OSError:
        return 0.0
    return metrics.get('reshard_coordinator_watch_streams{method="WatchJob"}', 0.0)


def test_watch_resumes_after_the_coordinator_dies_and_misses_nothing(cluster, client, job):
    broken = threading.Semaphore(0)  # one release per broken stream
    go_on = threading.Semaphore(0)   # the test lets the watcher reconnect

    def on_retry(method, failures, code, delay, detail):
        broken.release()
        go_on.acquire(timeout=60)

    watcher = Watcher(cluster, job.id, on_retry=on_retry)
    try:
        first = watcher.next()
        assert len(first.failed_ranks) == 0
        # 1. A change commits while the watcher is between streams.
        cluster.kill_coordinator()
        assert broken.acquire(timeout=SEEN_WITHIN_S), "the watcher never saw its stream break"
        cluster.start_coordinator()
        _rank_failure(client, job.id, 1)
        go_on.release()
        missed = watcher.next()
        assert [f.rank for f in missed.failed_ranks] == [1]
        assert missed.version > first.version
        # 2. Nothing changes while it is away: once it is back (its stream
        # open on the new coordinator), its first update is the next change,
        # not the state it saw already.
        cluster.kill_coordinator()
        assert broken.acquire(timeout=SEEN_WITHIN_S), "the watcher never saw its stream break"
        cluster.start_coordinator()
        go_on.release()
        faultlib.wait_until("the watcher's stream open again",
                            lambda: _open_job_watches(cluster) == 1.0, SEEN_WITHIN_S)
        _rank_failure(client, job.id, 2)
        after = watcher.next()
        assert sorted(f.rank for f in after.failed_ranks) == [1, 2]
        assert after.version > missed.version
    finally:
        for _ in range(4):
            go_on.release()
        watcher.close()


def test_an_open_watch_survives_a_postgres_restart(cluster, client, job):
    watcher = Watcher(cluster, job.id)
    try:
        first = watcher.next()
        cluster.restart_postgres()
        # The coordinator's pool and listener reconnect; the change may need
        # a few attempts while they do (the client retries UNAVAILABLE).
        faultlib.wait_until("a rank failure recorded after the restart",
                            lambda: _try(lambda: _rank_failure(client, job.id, 3)), 60)
        seen = watcher.next(timeout=60)
        while not seen.failed_ranks:  # a state re-read after the reconnect
            seen = watcher.next(timeout=60)
        assert [f.rank for f in seen.failed_ranks] == [3]
        assert seen.version > first.version
        assert watcher.ended.empty(), watcher.ended.get()
    finally:
        watcher.close()


def test_a_lost_notification_is_caught_by_the_safety_poll(cluster, client, job):
    watcher = Watcher(cluster, job.id)
    try:
        first = watcher.next()
        # The commit below sends no notification (the fault), so only the
        # coordinator's safety poll (--watch-resync-ms, 1 s) can tell.
        _psql(cluster, "ALTER TABLE jobs DISABLE TRIGGER jobs_announce")
        try:
            _rank_failure(client, job.id, 0)
            seen = watcher.next()
        finally:
            _psql(cluster, "ALTER TABLE jobs ENABLE TRIGGER jobs_announce")
        assert [f.rank for f in seen.failed_ranks] == [0]
        assert seen.version > first.version
    finally:
        watcher.close()


def _try(fn):
    try:
        fn()
        return True
    except Exception:  # noqa: BLE001: the database is coming back
        return False


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-s"]))
