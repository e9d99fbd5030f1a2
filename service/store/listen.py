"""PostgreSQL LISTEN/NOTIFY for the service's feed: every submission and cancel NOTIFYs
``malleable_jobs`` in its own transaction (delivered at commit), so the feed knows without a
query whether anything changed. Checking is a non-blocking read of one socket.

Anything wrong with the listening connection (no psycopg, a dropped server) makes ``heard``
answer True: the feed then reads the store on every poll, as it does on sqlite.
"""

from __future__ import annotations

from service.store import NOTIFY_CHANNEL, JobStore


class Listener:
    def __init__(self, conn) -> None:
        self.conn = conn
        self.broken = False

    @classmethod
    def open(cls, store: JobStore) -> Listener | None:
        """A listener on ``store``'s database, or None where it has no NOTIFY (sqlite) or cannot listen."""
        if store.engine.dialect.name != "postgresql":
            return None
        try:
            import psycopg

            url = store.engine.url.set(drivername="postgresql")
            conn = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True, connect_timeout=10)
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except Exception:  # noqa: BLE001 - no listener: the feed reads on every poll instead
            return None
        return cls(conn)

    def heard(self) -> bool:
        """Did a NOTIFY arrive since the last call (all of them drained)?"""
        if self.broken:
            return True
        try:
            pg = self.conn.pgconn
            pg.consume_input()
            got = False
            while pg.notifies() is not None:
                got = True
            return got
        except Exception:  # noqa: BLE001 - a dropped connection: read every poll from now on
            self.broken = True
            return True

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass
