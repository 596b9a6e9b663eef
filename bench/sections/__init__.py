"""The sections of `make bench`, one module each; :mod:`bench.suite` runs them in turn."""
