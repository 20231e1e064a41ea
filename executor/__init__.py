"""executor: a worker process that runs commands in the sandbox for the broker.

``python -m executor --connect ENDPOINT --token-file PATH`` joins a broker as a DEALER,
then for each ``run`` spawns the command under :mod:`landlock_helper`, streams its
stdout/stderr chunk by chunk under the wire's flow-control window, and reports how it
ended. Timeouts and cancels kill the whole process tree. See :mod:`broker.wire.frames`.
"""
