"""The Python client library of sluice: its public API, from one place.

::

    from broker.client import Client

    with Client.connect() as client:          # starts a daemon if none is running
        print(client.run(["make", "-j2"]).returncode)

:mod:`broker.client.connection` holds the client and its calls,
:mod:`broker.client.sessions` the agent sessions, :mod:`broker.client.control` starting
and stopping the local daemon; what they raise derives from :class:`SluiceError`.
"""

from broker.client.connection import Call, Client, Result, close_sockets
from broker.client.control import DaemonStatus, daemon_status, start_daemon, stop_daemon
from broker.client.errors import DaemonError, Interrupted, SessionError, SluiceError, UsageError
from broker.client.requests import make_request
from broker.client.sessions import ClientSession

__all__ = [
    "Call",
    "Client",
    "ClientSession",
    "DaemonError",
    "DaemonStatus",
    "Interrupted",
    "Result",
    "SessionError",
    "SluiceError",
    "UsageError",
    "close_sockets",
    "daemon_status",
    "make_request",
    "start_daemon",
    "stop_daemon",
]
