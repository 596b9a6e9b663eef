"""Uploads in progress, their finished parts, and the store operations a namespace change
implies (used by the drain, and by the filesystem's store keys and rebinding)."""

from __future__ import annotations

from ckptgw.fsops.journal.connection import Connection
from ckptgw.fsops.journal.rows import ROOT_INODE, StoreOp, UploadRow


class StoreQueries(Connection):
    def get_upload(self, inode: int) -> UploadRow | None:
        r = self.db.execute(
            "SELECT inode, generation, key, upload_id, part_size, size, checksum FROM uploads "
            "WHERE inode = ?",
            (inode,),
        ).fetchone()
        return None if r is None else UploadRow(*r)

    def all_uploads(self) -> list[UploadRow]:
        rows = self.db.execute(
            "SELECT inode, generation, key, upload_id, part_size, size, checksum FROM uploads"
        ).fetchall()
        return [UploadRow(*r) for r in rows]

    def put_upload(self, u: UploadRow) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO uploads VALUES (?, ?, ?, ?, ?, ?, ?)",
            (u.inode, u.generation, u.key, u.upload_id, u.part_size, u.size, u.checksum),
        )

    def drop_upload(self, inode: int) -> None:
        self.db.execute("DELETE FROM uploads WHERE inode = ?", (inode,))
        self.db.execute("DELETE FROM parts WHERE inode = ?", (inode,))

    def parts(self, inode: int) -> dict[int, tuple[str, int | None]]:
        """Part number -> (ETag, CRC32 of the bytes sent)."""
        rows = self.db.execute("SELECT number, etag, crc32 FROM parts WHERE inode = ?", (inode,))
        return {int(r[0]): (str(r[1]), None if r[2] is None else int(r[2])) for r in rows}

    def add_part(self, inode: int, number: int, etag: str, crc32: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO parts VALUES (?, ?, ?, ?)", (inode, number, etag, crc32)
        )

    def add_store_op(
        self, kind: str, src: str, dst: str | None = None, etag: str | None = None
    ) -> None:
        self.db.execute(
            "INSERT INTO store_ops (kind, src, dst, etag) VALUES (?, ?, ?, ?)",
            (kind, src, dst, etag),
        )

    def has_store_op(self, kind: str, src: str) -> bool:
        r = self.db.execute(
            "SELECT 1 FROM store_ops WHERE kind = ? AND src = ? LIMIT 1", (kind, src)
        ).fetchone()
        return r is not None

    def store_ops_from(self, key: str) -> list[StoreOp]:
        """Pending operations that delete ``key`` or move its object away, in order."""
        rows = self.db.execute(
            "SELECT id, kind, src, dst, etag FROM store_ops "
            "WHERE src = ? AND kind IN ('delete', 'move') ORDER BY id",
            (key,),
        ).fetchall()
        return [StoreOp(*r) for r in rows]

    def store_op_pending(self, op_id: int) -> bool:
        r = self.db.execute("SELECT 1 FROM store_ops WHERE id = ?", (op_id,)).fetchone()
        return r is not None

    def store_ops(self, limit: int = 1000) -> list[StoreOp]:
        rows = self.db.execute(
            "SELECT id, kind, src, dst, etag FROM store_ops ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        return [StoreOp(*r) for r in rows]

    def done_store_op(self, op_id: int) -> None:
        self.db.execute("DELETE FROM store_ops WHERE id = ?", (op_id,))

    def count_store_ops(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM store_ops").fetchone()[0])

    def holds_nothing(self) -> bool:
        """No entry but the root, no upload and no store operation: nothing that belongs to
        the store this cache is bound to."""
        return not self.db.execute(
            "SELECT EXISTS (SELECT 1 FROM inodes WHERE id != ?) "
            "OR EXISTS (SELECT 1 FROM uploads) OR EXISTS (SELECT 1 FROM store_ops)",
            (ROOT_INODE,),
        ).fetchone()[0]

    def forget_store(self) -> tuple[int, int]:
        """Drop every upload in progress, its parts and every pending store operation: they
        name objects of a store this cache is no longer bound to. Returns (multipart uploads,
        store operations) dropped."""
        uploads = self.db.execute(
            "SELECT count(*) FROM uploads WHERE upload_id IS NOT NULL"
        ).fetchone()[0]
        ops = self.count_store_ops()
        self.db.execute("DELETE FROM parts")
        self.db.execute("DELETE FROM uploads")
        self.db.execute("DELETE FROM store_ops")
        return int(uploads), ops

    def pending_keys(self) -> set[str]:
        """Keys that a pending store operation reads or writes."""
        rows = self.db.execute("SELECT src, dst FROM store_ops").fetchall()
        return {k for r in rows for k in r if k is not None}
