//! The `requests` table: one accounting row per proxied request, written by the proxy as each
//! request ends and read by the admin page and `crossbar report`. Token counts the upstream did not
//! report are NULL, never 0.

use rusqlite::{params, Connection, Row};

use super::{sql_limit, RequestRow, Store, StoreError};

impl Store {
    /// Appends one accounting row (its `id` is ignored) and returns its id.
    pub fn record_request(&self, row: &RequestRow) -> Result<i64, StoreError> {
        let conn = self.conn.lock();
        insert_request(&conn, row)
    }

    /// The latest `limit` accounting rows, newest first.
    pub fn recent_requests(&self, limit: usize) -> Result<Vec<RequestRow>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {REQUEST_COLUMNS} FROM requests ORDER BY id DESC LIMIT ?1"
        ))?;
        let rows = stmt.query_map([sql_limit(limit)], request_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Accounting rows that started at or after `since_ms`, of one route or all, oldest first.
    pub fn requests_since(
        &self,
        since_ms: i64,
        route: Option<&str>,
    ) -> Result<Vec<RequestRow>, StoreError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {REQUEST_COLUMNS} FROM requests
             WHERE started >= ?1 AND (?2 IS NULL OR route = ?2)
             ORDER BY started, id"
        ))?;
        let rows = stmt.query_map(params![since_ms, route], request_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

const REQUEST_COLUMNS: &str = "id, started, route, fp, model, host, queued_ms, ttfb_ms, total_ms, \
     status, streamed, prompt_tokens, cached_tokens, completion_tokens, err, ctx_est, ctx_exact, api";

fn insert_request(conn: &Connection, row: &RequestRow) -> Result<i64, StoreError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO requests (started, route, fp, model, host, queued_ms, ttfb_ms, total_ms,
           status, streamed, prompt_tokens, cached_tokens, completion_tokens, err, ctx_est,
           ctx_exact, api)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
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
        row.api
    ])?;
    Ok(conn.last_insert_rowid())
}

fn request_from_row(r: &Row<'_>) -> rusqlite::Result<RequestRow> {
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
    })
}
