"""sluice on a Ray cluster (the ``ray`` extra): executors placed on every node, restarted
and scaled by Ray, keys handed out through Ray.

:mod:`.cluster` is the API (``up``, ``status``, ``down``, ``connect``, ``remote``; also
here, ``broker.ray.connect()``), :mod:`.controller` the actor that runs the daemon and
places the executors, :mod:`.node` the executor actor of each node, :mod:`.scaling` when
to ask the autoscaler for CPUs, :mod:`.children` the processes the actors run,
:mod:`.names` how they are found. The API's names import Ray when first used; the
modules without Ray (:mod:`.scaling`, :mod:`.names`) import without it.
"""

from __future__ import annotations

_API = {"RayError", "connect", "down", "join", "remote", "status", "up"}

__all__ = sorted(_API | {"Settings"})


def __getattr__(name: str):
    if name in _API:
        from broker.ray import cluster

        return getattr(cluster, name)
    if name == "Settings":
        from broker.ray.controller import Settings

        return Settings
    raise AttributeError(f"module 'broker.ray' has no attribute {name!r}")
