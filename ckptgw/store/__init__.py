"""The object store, the bottom floor: the interface every store meets (:mod:`.interface`), S3
(:mod:`.s3`, with its deadlines and its part worker processes) and a directory (:mod:`.files`),
opened from a URL (:mod:`.url`, :mod:`.open`); retries and pacing (:mod:`.retry`,
:mod:`.pacing`); CRC32 as S3 uses it (:mod:`.crc`); and the stores and proxy that tests and
benches use (:mod:`.memory`, :mod:`.faultproxy`). It imports nothing from the filesystem, the
drain or the gateway above it."""
