//! What the `#[pg_test]`s share: one-value queries, and errors caught by SQLSTATE.

use pgrx::prelude::*;

/// The one bigint `query` returns.
pub fn int(query: &str) -> i64 {
    Spi::get_one::<i64>(query)
        .expect("query runs")
        .expect("query returns a value")
}

/// The one text `query` returns, or None for NULL.
pub fn text(query: &str) -> Option<String> {
    Spi::get_one::<String>(query).expect("query runs")
}

/// Runs `query` and returns `SQLSTATE: message` of the error it raises, or None if it succeeds.
pub fn error_of(query: &str) -> Option<String> {
    Spi::run(
        "CREATE OR REPLACE FUNCTION pg_temp.error_of(q text) RETURNS text LANGUAGE plpgsql AS $$
         BEGIN EXECUTE q; RETURN NULL;
         EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$",
    )
    .expect("helper created");
    let quoted = query.replace('\'', "''");
    text(&format!("SELECT pg_temp.error_of('{quoted}')"))
}

/// `n` calls of `rate_limiting_request(id, rate, window)`, in order.
pub fn requests(id: &str, rate: i32, window: i32, n: usize) -> Vec<i64> {
    (0..n)
        .map(|_| {
            int(&format!(
                "SELECT rate_limiting_request('{id}', {rate}, {window})::bigint"
            ))
        })
        .collect()
}
