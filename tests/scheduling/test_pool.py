"""The workers of a batch (`scheduling/pool.py`) with a stand-in launcher: starting, dispatch,
stopping, and replacements bounded (the feed loop's rules: test_queue.py, test_group.py)."""

from __future__ import annotations

from sagevideo.scheduling.pool import Pool, Task


class Launcher:
    def __init__(self):
        self.started, self.stopped, self.ran = 0, [], []

    def start(self):
        self.started += 1
        return [f"actor-{self.started}"], None, [f"ready-{self.started}"]

    def run(self, actors, pj, attempt):
        self.ran.append((actors[0], pj, attempt))
        return [f"run-{actors[0]}"]

    def stop(self, actors, group):
        self.stopped.append(actors[0])


def test_a_pool_starts_its_workers_and_bounds_replacements():
    launcher = Launcher()
    pool = Pool(launcher, size=2, max_attempts=1)
    assert launcher.started == 2 and len(pool.starting) == 2 and pool.alive == 2
    assert pool.start() and pool.start() and not pool.start()  # 2 x (1 + max_attempts) starts in all
    assert launcher.started == 4


def test_dispatch_and_stop():
    launcher = Launcher()
    pool = Pool(launcher, size=1, max_attempts=3)
    (ref, worker), = pool.starting.items()
    del pool.starting[ref]
    worker.pending.clear()
    pool.idle.append(worker)
    pool.dispatch(worker, Task(0, job="job"))
    assert launcher.ran == [("actor-1", "job", 1)] and pool.busy_workers() == [worker] and pool.ready == 1
    assert pool.overdue(worker.started + 10, limit_s=5) == [worker] and pool.overdue(worker.started + 10, None) == []
    assert pool.stop(worker) == ["run-actor-1"] and launcher.stopped == ["actor-1"] and pool.alive == 0
