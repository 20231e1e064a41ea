"""The net layer: what every process of sluice shares to talk to the daemon. The one peer
link (:mod:`.link`, its rules, sans-io; :mod:`.aiolink`, its asyncio shell; the client
library is its blocking shell) and what it is made of (:mod:`.peer`), the caller's table of
calls (:mod:`.calls`, sans-io), asyncio glue for ZeroMQ sockets (:mod:`.zloop`), signals
that wake a poller (:mod:`.signals`), the runtime dir (:mod:`.runtime`), logging
(:mod:`.logging`) and CurveZMQ key files (:mod:`.keys`)."""
