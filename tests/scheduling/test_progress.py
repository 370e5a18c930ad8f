"""The progress relay (`scheduling/progress.py`): the newest step report becomes the status."""

from __future__ import annotations

from sagevideo.scheduling.progress import StepStatus


class FakeQueue:
    def __init__(self, items=(), broken=False):
        self.items, self.broken = list(items), broken

    def qsize(self):
        if self.broken:
            raise ConnectionError("the queue's actor is gone")
        return len(self.items)

    def get_nowait_batch(self, n):
        taken, self.items = self.items[:n], self.items[n:]
        return taken


def test_the_newest_report_is_shown_with_the_running_count():
    shown = []
    steps = StepStatus(FakeQueue(["cat 1/3", "cat 2/3"]), shown.append)
    steps.poll(running=1)
    steps.poll(running=1)  # nothing new: nothing shown
    assert shown == ["cat 2/3"]
    StepStatus(FakeQueue(["dog 1/3"]), shown.append).poll(running=2)
    assert shown[-1] == "2 running, dog 1/3"


def test_a_queue_that_cannot_be_read_is_skipped():
    shown = []
    StepStatus(FakeQueue(broken=True), shown.append).poll(running=1)
    assert shown == []
