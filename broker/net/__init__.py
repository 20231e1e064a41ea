"""The net layer: what every process of sluice shares to talk to the daemon. The peer
rules (:mod:`.peer`), asyncio glue for ZeroMQ sockets (:mod:`.zloop`), the runtime dir
(:mod:`.runtime`), logging (:mod:`.logging`) and CurveZMQ key files (:mod:`.keys`)."""
