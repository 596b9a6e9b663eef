"""The read path: what the store holds, as this node's filesystem sees it.

* ``listing.py``: the shared namespace; how a directory's listing is merged into the journal
  (local entries win; what was rewritten or deleted elsewhere is replaced or goes).
* ``entries.py``: one entry described from its object's metadata (a HEAD, or a fetch's first
  response).
* ``lookupwait.py``: how long a lookup waits for the store, and the stalls of a slow one.
* ``fetch.py``: a remote file's content brought into the cache with ranged GETs, verified.
* ``prefetch.py``: a warm-up, a whole checkpoint fetched before its files are read.
* ``readthrough.py``: the above joined as the filesystem's :class:`fsops.remote.Remote`.

What it promises: a node never drops its own dirty data for what a listing says; a lookup
waits for the store at most ``store.lookup_wait`` and never answers a false "no such file";
a fetch is pinned to one ETag (never a mix of versions) and its content is verified against
the stored checksum before the file becomes clean. It imports nothing of the other rooms.
"""
