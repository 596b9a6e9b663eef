"""The daemon, its configuration and the ``ckptgw`` command line."""
