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

__all__ = ["COMMAND", "FORMS_ROOM", "PRODUCTS", "StaleProducts", "sources", "sources_digest", "require_current"]

COMMAND = "python -m kestrel_trio._kernels.portable.forms.generate"
FORMS_ROOM = Path(__file__).resolve().parent  # this folder: the homes, the template, the generator
PRODUCTS = FORMS_ROOM.parent / "products.py"  # the generated file


class StaleProducts(RuntimeError):
    """products.py was generated from sources that have changed since: its numba cache may be stale."""


def sources(room: Path = FORMS_ROOM) -> list[Path]:
    """The files products.py is made from, in ``room`` (this folder), in a fixed order: every module here (the
    homes' loops, the dot loops, the bits they read, the template, and the generator and this module, which
    decide the file's text too)."""
    return sorted(room.glob("*.py"))


def sources_digest(room: Path = FORMS_ROOM) -> str:
    """sha256 (hex) of :func:`sources` in ``room``: each file's name and its bytes."""
    digest = hashlib.sha256()
    for path in sources(room):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def require_current(digest: str, room: Path = FORMS_ROOM) -> None:
    """Raise :class:`StaleProducts` unless ``digest`` (the one products.py was generated with) is the digest of
    the sources in ``room`` now.

    Raises:
        StaleProducts: a source changed after products.py was generated; the message names the command.
    """
    now = sources_digest(room)
    if now != digest:
        raise StaleProducts(f"{PRODUCTS} was generated from other sources than those in {room} now (digest "
                            f"{digest[:12]}, now {now[:12]}): numba would keep running the old loops from its cache. "
                            f"Regenerate it: {COMMAND}")
