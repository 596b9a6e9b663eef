"""What the CLI and the daemon agree on, kept free of heavy imports so that ``ckptgw status``
(a readiness probe every few seconds) starts without loading the filesystem or the S3 client."""

from __future__ import annotations

# The control socket's request/reply version (gateway/control.py serves it).
PROTOCOL_VERSION = 1
# The daemon writes one byte to this inherited fd once the mount is ready (``ckptgw mount``).
READY_FD_ENV = "CKPTGW_READY_FD"
