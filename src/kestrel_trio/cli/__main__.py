"""``python -m kestrel_trio.cli``: the ``kestrel-trio`` command, for an environment without the console script."""

import sys

from kestrel_trio.cli import main

sys.exit(main())
