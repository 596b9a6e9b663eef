"""The FUSE filesystem: pyfuse3 operations, the metadata journal and the cache files."""
