//! The `requests` table's columns: one accounting row per proxied request, inserted by the writer
//! thread and read back by [`super::Reader`]. Token counts the upstream did not report are NULL,
//! never 0.

use rusqlite::{params, Connection, Row};

use super::RequestRow;

pub(super) const REQUEST_COLUMNS: &str =
    "id, started, route, fp, model, host, queued_ms, ttfb_ms, total_ms, \
     status, streamed, prompt_tokens, cached_tokens, completion_tokens, err, ctx_est, ctx_exact, api, \
     family, placed, key";

pub(super) fn insert_request(conn: &Connection, row: &RequestRow) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO requests (started, route, fp, model, host, queued_ms, ttfb_ms, total_ms,
           status, streamed, prompt_tokens, cached_tokens, completion_tokens, err, ctx_est,
           ctx_exact, api, family, placed, key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
           ?19, ?20)",
    )?;
    stmt.execute(params![
        row.started,
        row.route,
        row.fp,
        row.model,
        row.host,
        row.queued_ms,
        row.ttfb_ms,
        row.total_ms,
        row.status,
        row.streamed,
        row.prompt_tokens,
        row.cached_tokens,
        row.completion_tokens,
        row.err,
        row.ctx_est,
        row.ctx_exact,
        row.api,
        row.family,
        row.placed,
        row.key
    ])?;
    Ok(())
}

/// Deletes those of the first `limit` rows recorded that started before `before`: a round reads
/// at most `limit` rows, by id, with no index on `started` (issue 26). Rows go in as their
/// answers end, so the oldest lead; one that started before the cutoff but was recorded after
/// younger ones (a request that ran longer) goes once it is among the first `limit`.
pub(super) fn prune(conn: &Connection, before: i64, limit: usize) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(
        "DELETE FROM requests WHERE id IN
           (SELECT id FROM (SELECT id, started FROM requests ORDER BY id LIMIT ?2)
            WHERE started < ?1)",
    )?;
    stmt.execute(params![before, super::sql_limit(limit)])?;
    Ok(())
}

pub(super) fn request_from_row(r: &Row<'_>) -> rusqlite::Result<RequestRow> {
    Ok(RequestRow {
        id: r.get(0)?,
        started: r.get(1)?,
        route: r.get(2)?,
        fp: r.get(3)?,
        model: r.get(4)?,
        host: r.get(5)?,
        queued_ms: r.get(6)?,
        ttfb_ms: r.get(7)?,
        total_ms: r.get(8)?,
        status: r.get(9)?,
        streamed: r.get(10)?,
        prompt_tokens: r.get(11)?,
        cached_tokens: r.get(12)?,
        completion_tokens: r.get(13)?,
        err: r.get(14)?,
        ctx_est: r.get(15)?,
        ctx_exact: r.get(16)?,
        api: r.get(17)?,
        family: r.get(18)?,
        placed: r.get(19)?,
        key: r.get(20)?,
    })
}
