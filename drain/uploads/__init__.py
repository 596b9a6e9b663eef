"""The upload engine: every change made on this node reaches the store, and is known to.

* ``scheduler.py``: when a file goes (the settle delay, the bounds, retries, ``flush``, the
  emergency drain). It knows inode numbers and keys only, and is the filesystem's
  :class:`fsops.events.DrainEvents`.
* ``engine.py``: the scheduler's worker, joining it to the filesystem and the store; holds
  the one definition of durable (:meth:`DrainEngine.durability`) that status, ``wait``,
  retention and the shutdown go by.
* ``upload.py``: one entry's upload, a single PUT or a resumable multipart upload, each byte
  read once and checksummed in that read.
* ``storeops.py``: the moves, deletes and metadata updates that namespace changes journaled,
  carried out in order.
* ``progress.py``: the counters and per-upload progress that status and the metrics read.

What it promises: an upload sends the current generation of an entry to its current key; a
change during the upload stops it and makes the file due again; no key an entry holds is
deleted; a failure is retried later, and a dirty quiet file is never forgotten (the
scheduler's audit). It imports neither other room.
"""
