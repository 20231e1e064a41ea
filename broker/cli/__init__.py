"""The ``sluice`` command line, the top layer: nothing imports it. :mod:`.main` parses and
hands each command to its module (:mod:`.run`, :mod:`.sandbox`, :mod:`.daemon`,
:mod:`.keys`, :mod:`.exec`, :mod:`.attach`); :mod:`.base` holds what they share,
:mod:`.render` and :mod:`.turns` what the session frontends share."""
