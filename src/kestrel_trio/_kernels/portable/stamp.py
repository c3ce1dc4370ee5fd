"""The digest that ties kestrel_trio._kernels.portable.products to the sources it was generated from, checked at
each import of it.

numba keys a cached function on its own file's stamp, so an edit to a loop
it calls in another file would leave the old machine code cached. products.py
embeds :func:`sources_digest` as it was when generated and calls
:func:`require_current` at import: a changed source without a regenerated
products.py raises :class:`StaleProducts` (naming the command that
regenerates it, :data:`COMMAND`) instead of running stale code. Reading and
hashing the sources costs well under a millisecond: a few small files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["COMMAND", "PORTABLE", "StaleProducts", "sources", "sources_digest", "require_current"]

COMMAND = "python -m kestrel_trio._kernels.portable.generate"
PORTABLE = Path(__file__).resolve().parent  # the folder of the template, the forms' homes and products.py


class StaleProducts(RuntimeError):
    """products.py was generated from sources that have changed since: its numba cache may be stale."""


def sources(root: Path = PORTABLE) -> list[Path]:
    """The files products.py's functions are made of, under ``root`` (the portable folder): the template and
    every module of the forms' homes (their loops, the dot loops, the bits they read), in a fixed order."""
    return [root / "template.py", *sorted((root / "forms").glob("*.py"))]


def sources_digest(root: Path = PORTABLE) -> str:
    """sha256 (hex) of :func:`sources` under ``root``: each file's path below ``root`` and its bytes."""
    digest = hashlib.sha256()
    for path in sources(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def require_current(digest: str, root: Path = PORTABLE) -> None:
    """Raise :class:`StaleProducts` unless ``digest`` (the one products.py was generated with) is the sources'
    digest now.

    Raises:
        StaleProducts: a source changed after products.py was generated; the message names the command.
    """
    now = sources_digest(root)
    if now != digest:
        raise StaleProducts(f"{root / 'products.py'} was generated from other sources than {root}'s template.py "
                            f"and forms/ now (digest {digest[:12]}, now {now[:12]}): numba would keep running the "
                            f"old loops from its cache. Regenerate it: {COMMAND}")
