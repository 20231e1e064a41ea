"""``sluice web``: the daemon's sessions in a browser, one more frontend over the client library.

:mod:`.serve` is the command, :mod:`.guard` who may use the page, :mod:`.app` the page's API,
:mod:`.link` the clients that talk to the daemon, :mod:`.hub` one attachment per session
shared by the tabs; ``static/`` holds the page itself (``render.js`` puts text on it, never
HTML; ``vendor/`` holds xterm.js and the script that fetches it).
"""
