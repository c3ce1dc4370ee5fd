"""The ``kestrel-trio`` command: the only code that reads argv and calls ``trio.run``.

The room holds:

* ``dispatch``: :func:`main`, the console script's entry point: argv parsed, the checks between flags, the command
  run;
* ``parser``: the argument parser, its commands and the flags only ``serve`` takes;
* ``flags``: the flags the commands share and the argparse types that check their values;
* ``serve``: ``kestrel-trio serve`` under ``trio.run``, its signals and a clean exit;
* ``text``: the terminal commands ``generate`` and ``chat``;
* ``errors``: a failure as one line and an exit code;
* ``progress``: weight-load progress on a terminal or in a log.

``kestrel_trio.cli:main`` is the console script's path (pyproject.toml) and ``python -m kestrel_trio.cli`` runs it
(``__main__``): both stay as they are.
"""

from kestrel_trio.cli.dispatch import main

__all__ = ["main"]
