"""The wire layer: what crosses a socket. The Codex protocol types (:mod:`.protocol`),
the internal frames between the daemon and its peers (:mod:`.frames`), and how a command
ended as one shell-style number, with the exit codes of every sluice command
(:mod:`.results`). Imports nothing of sluice but the sandbox's policy."""
