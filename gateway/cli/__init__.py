"""The command line: ``ckptgw`` and its commands, its reference and completion."""
