"""When to ask the Ray autoscaler for CPUs, and when to give them back (no Ray here).

``ray.autoscaler.sdk.request_resources(num_cpus=N)`` asks for a cluster of *at least* N
CPUs in all; it is a floor that stays until replaced, not an increment. So the request
is the CPUs the cluster has plus what the waiting commands need (``slots_per_cpu``
commands per CPU), renewed upwards while commands keep waiting, and replaced by 0 (no
floor: the autoscaler may remove idle nodes again) once nothing ran or waited for
``idle_s``. The controller feeds :meth:`Scaler.observe` once a second with what the
daemon reports and sends each request it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """A floor on the cluster's CPUs (0: none), and why it was asked for, in one line."""

    cpus: int
    why: str
    at: float


class Scaler:
    def __init__(self, *, wait_s: float, idle_s: float, slots_per_cpu: int, max_cpus: int | None = None) -> None:
        self.wait_s = wait_s
        self.idle_s = idle_s
        self.slots_per_cpu = max(1, slots_per_cpu)
        self.max_cpus = max_cpus
        # What is asked now (None: nothing ever was).
        self.current: Request | None = None
        self._waiting_since: float | None = None
        self._idle_since: float | None = None

    def observe(self, now: float, *, queued: int, busy: int, cluster_cpus: int) -> Request | None:
        """The request to send now (one that changes what is asked), or None."""
        if queued > 0:
            self._idle_since = None
            if self._waiting_since is None:
                self._waiting_since = now
            if now - self._waiting_since < self.wait_s:
                return None
            want = cluster_cpus + math.ceil(queued / self.slots_per_cpu)
            if self.max_cpus is not None:
                want = min(want, self.max_cpus)
            if self.current is not None and want <= self.current.cpus:
                return None
            self.current = Request(want, f"{queued} command(s) waited more than {self.wait_s:g} s for a free slot "
                                         f"on {cluster_cpus} CPU(s)", now)
            return self.current
        self._waiting_since = None
        if busy > 0:
            self._idle_since = None
            return None
        if self._idle_since is None:
            self._idle_since = now
        if self.current is None or self.current.cpus == 0 or now - self._idle_since < self.idle_s:
            return None
        self.current = Request(0, f"released: nothing ran or waited for {self.idle_s:g} s", now)
        return self.current
