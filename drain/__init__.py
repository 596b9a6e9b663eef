"""Above the store, in three rooms, and the checkpoint model they share:

* ``uploads/``: the upload engine. When a file goes to the store, how it goes, the store
  operations namespace changes journaled, and the one definition of durable.
* ``reads/``: the read path. The shared namespace (the store's listings merged into the
  journal), the description of an entry, how long a lookup waits, fetches and warm-ups.
* ``retention/``: which checkpoints of a run to keep (a pure plan), its application to the
  bucket and the caches, pins, and the store's checkpoints as status shows them.

``checkpoints.py`` (which files form a checkpoint, its state, the one count of its entries)
stands beside the rooms, not in one: every room uses it (the engine says durability in its
words, a warm-up finds its checkpoint with it, retention groups and counts by it), and so does
the gateway's status. Inside retention it would make the read path import retention, which
imports the read path (an object's metadata). Imports between the rooms go one way:
``retention`` → ``reads``, and every room → ``checkpoints``; ``uploads`` imports neither
other room.
"""
