//! What a [`Write`] is and the SQL that applies it: the writer (`writer.rs`) decides who commits
//! and when; this file only knows how a batch of writes becomes one transaction.

use rusqlite::{params, Connection};

use super::{LeaseEvent, LeaseRow, RequestRow};

/// One change to the database.
#[derive(Debug, Clone)]
pub enum Write {
    /// Inserts or replaces the lease (or pin) keyed by route, fp, model.
    SaveLease(LeaseRow),
    /// Deletes one lease or pin; a missing one is not an error.
    DeleteLease {
        route: String,
        fp: String,
        model: String,
    },
    /// Moves a lease's `last_used` forward (never back); a missing lease is not an error.
    Touch {
        route: String,
        fp: String,
        model: String,
        last_used: i64,
    },
    /// Appends a lease event.
    Event(LeaseEvent),
    /// Appends an accounting row.
    Request(RequestRow),
    /// Deletes those of the first `limit` accounting rows recorded that started before `before`
    /// ([`super::requests::prune`]).
    PruneRequests { before: i64, limit: usize },
    /// Deletes up to `limit` of the oldest lease events before `before`.
    PruneEvents { before: i64, limit: usize },
    /// Caps the file at `n` pages (never below its current size: `Some(1)` freezes it), or lifts
    /// the cap (`None`):
    /// SQLite's own `max_page_count`, so tests get a real "database or disk is full".
    #[doc(hidden)]
    LimitPages(Option<u32>),
}

/// Commits `writes` as one transaction; answers whether any row changed. A commit that changed
/// nothing (a prune with nothing old, a touch of a gone lease) appends nothing to the WAL, so it
/// proves nothing about a full disk and must not end a failure burst.
pub(super) fn commit<'a>(
    conn: &mut Connection,
    writes: impl Iterator<Item = &'a Write>,
) -> rusqlite::Result<bool> {
    let before = conn.total_changes();
    let mut writes = writes.peekable();
    let first = writes.next();
    if writes.peek().is_none() {
        // One write is its own transaction (a lone request's row, issue 26): SQLite commits it
        // when the statement ends, without a BEGIN and a COMMIT of its own to run. Only this
        // connection writes, so its read never has to become a write behind another writer.
        if let Some(write) = first {
            apply(conn, write)?;
        }
        return Ok(conn.total_changes() > before);
    }
    // Prepared once and cached like the writes themselves: a commit is on a request's path.
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let done = first
        .into_iter()
        .chain(writes)
        .try_for_each(|write| apply(conn, write))
        .and_then(|()| conn.prepare_cached("COMMIT")?.execute([]).map(drop));
    if done.is_err() && !conn.is_autocommit() {
        // Nothing of a failed batch stays: it is retried job by job.
        let _ = conn.execute_batch("ROLLBACK");
    }
    done?;
    Ok(conn.total_changes() > before)
}

fn apply(conn: &Connection, write: &Write) -> rusqlite::Result<()> {
    match write {
        Write::SaveLease(row) => {
            let mut stmt = conn.prepare_cached(
                "INSERT INTO leases (route, fp, model, host, state, created, last_used)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (route, fp, model) DO UPDATE SET
                   host = excluded.host, state = excluded.state,
                   created = excluded.created, last_used = excluded.last_used",
            )?;
            stmt.execute(params![
                row.route,
                row.fp,
                row.model,
                row.host,
                row.state,
                row.created,
                row.last_used
            ])?;
        }
        Write::DeleteLease { route, fp, model } => {
            let mut stmt = conn
                .prepare_cached("DELETE FROM leases WHERE route = ?1 AND fp = ?2 AND model = ?3")?;
            stmt.execute(params![route, fp, model])?;
        }
        Write::Touch {
            route,
            fp,
            model,
            last_used,
        } => {
            let mut stmt = conn.prepare_cached(
                "UPDATE leases SET last_used = max(last_used, ?4)
                 WHERE route = ?1 AND fp = ?2 AND model = ?3",
            )?;
            stmt.execute(params![route, fp, model, last_used])?;
        }
        Write::Event(ev) => {
            let mut stmt = conn.prepare_cached(
                "INSERT INTO lease_events (at, route, fp, model, reason, from_host, to_host)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            stmt.execute(params![
                ev.at,
                ev.route,
                ev.fp,
                ev.model,
                ev.reason,
                ev.from_host,
                ev.to_host
            ])?;
        }
        Write::Request(row) => super::requests::insert_request(conn, row)?,
        Write::PruneRequests { before, limit } => super::requests::prune(conn, *before, *limit)?,
        Write::PruneEvents { before, limit } => {
            let mut stmt = conn.prepare_cached(
                "DELETE FROM lease_events WHERE id IN
                   (SELECT id FROM lease_events WHERE at < ?1 ORDER BY at LIMIT ?2)",
            )?;
            stmt.execute(params![before, super::sql_limit(*limit)])?;
        }
        Write::LimitPages(pages) => {
            // SQLite's default; a cap below the current size becomes the current size.
            let pages = pages.unwrap_or(1_073_741_823);
            let _now: i64 =
                conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
                    r.get(0)
                })?;
        }
    }
    Ok(())
}
