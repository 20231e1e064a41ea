"""The daemon (``sluice daemon``): the server and its sockets (:mod:`.server`), routing
(:mod:`.router`), agent sessions and their event logs (:mod:`.sessions`, :mod:`.journal`),
the agent and executor processes (:mod:`.supervisor`), and the tcp listener with its
authentication (:mod:`.listener`). Nothing imports it but the CLI."""
