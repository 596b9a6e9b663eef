"""The metadata journal: namespace, per-file state and xattrs in one SQLite database (WAL).

Every SQL statement of the project lives in this package. Callers get plain rows back.

Durability model
----------------
The connection runs with ``synchronous=NORMAL``: a commit reaches the WAL file in the OS page
cache, so it survives a crash of the daemon (``kill -9``) but not yet a power loss.
:meth:`Journal.barrier` makes every commit so far durable by fsyncing the WAL; ``fsync`` and
``fsyncdir`` of the filesystem call it, which is what makes their promise hold. SQLite
guarantees that frames moved out of the WAL by a checkpoint are fsynced in the main database
before the WAL is reused, so fsyncing the WAL covers every earlier commit.

The package, floor by floor: :mod:`.rows` (the plain rows the rest of the code imports),
:mod:`.schema` (the tables), :mod:`.connection` (the connection, migrations, transactions),
:mod:`.barrier` (group commit), and the query sets :mod:`.namespace`, :mod:`.uploads` (uploads
and store operations) and :mod:`.status`. :class:`Journal` is all of them in one object.
"""

from __future__ import annotations

from ckptgw.fsops.journal.barrier import Barrier
from ckptgw.fsops.journal.connection import JournalError
from ckptgw.fsops.journal.namespace import NamespaceQueries
from ckptgw.fsops.journal.status import StatusQueries
from ckptgw.fsops.journal.uploads import StoreQueries

__all__ = ["Journal", "JournalError"]


class Journal(NamespaceQueries, StoreQueries, StatusQueries, Barrier):
    """The metadata journal: one SQLite connection and every query on it. Used from the trio
    thread only."""

    def begin_epoch(self) -> int:
        """Start a mount epoch, durably, before any inode number is given out in it. Within an
        epoch numbers only grow (a deleted newest inode does not give its number back); a
        number freed in an earlier epoch may come back, with the new epoch as its handle
        generation, so a client's handle of the old file gets ESTALE. Durable first: after a
        power loss that rolled back creates a client had seen, the next epoch still differs."""
        with self.transaction():
            self.epoch = (self.epoch + 1) & 0xFFFFFFFF  # the kernel keeps 32 bits of it
            self.set_meta("epoch", str(self.epoch))
        self.barrier_sync()
        return self.epoch
