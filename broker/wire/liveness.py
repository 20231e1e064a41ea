"""The liveness timeouts of sluice, shortest first. The order is the point:

- The daemon pings every peer each heartbeat (it says the heartbeat in its welcome).
- It gives up on a peer (an executor, the agent, a frontend with calls in flight) that
  has been silent for DEAD_AFTER_HEARTBEATS heartbeats (a frontend: FRONTEND_SILENCE_S at
  the least), counting only heartbeats at which it had read all its input: a pong waiting in the daemon's own queue behind a flood is
  not a silent peer. A peer's process that exits is seen at once (pidfd, disconnection);
  a frontend whose process is stopped (Ctrl-Z) is kept, silent, up to the daemon's
  ``--suspend-limit`` (an hour by default, broker.daemon.router.SUSPEND_LIMIT_S).
- A peer says it is waiting for a daemon quiet for WAITING_SAID_AFTER heartbeats, and gives
  it up after PATIENCE_HEARTBEATS, far longer than the daemon's own check: a daemon that
  stalls (SIGSTOP, a swap storm, a VM migration) for up to that long finds every peer,
  session and command as it left them, and it is always the daemon, never the peer, that
  decides a link is dead while both are running. A daemon that exits is noticed at once
  (its socket disconnects, its socket file goes, spawned peers die with it), so the long
  patience costs only when the daemon is alive and stuck.

Every peer reads them from here (through :mod:`broker.net.peer`); the daemon says the
heartbeat in its welcome, and a caller of run.sock (:mod:`broker.wire.direct`) gives the
daemon up after the same patience.
"""

HEARTBEAT_S = 1.0
DEAD_AFTER_HEARTBEATS = 10
# A frontend's allowance, in seconds whatever heartbeat the daemon was given (``sluice
# daemon --heartbeat``): a program using the client library answers pings only while it
# waits on the client, so a heartbeat made faster to notice a powered-off executor host
# sooner must not cut the time such a program may spend elsewhere.
FRONTEND_SILENCE_S = DEAD_AFTER_HEARTBEATS * HEARTBEAT_S
WAITING_SAID_AFTER = 3
PATIENCE_HEARTBEATS = 60
# How long a peer waits for a quiet daemon before giving it up, in seconds: the first ping
# goes after a heartbeat of silence, the patience counts from there.
PATIENCE_S = (PATIENCE_HEARTBEATS + 1) * HEARTBEAT_S
