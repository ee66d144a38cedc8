//! The newer kinds of limit in both stores alike: calendar windows, concurrency leases, blocks and the
//! penalty box, each also in read-only transactions and under shadow mode.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};

    /// A calendar window opens at the same end in both stores: the next first of the month at 00:00 in
    /// Paris, as PostgreSQL's own date arithmetic says, and takes its rate from the window.
    #[pg_test]
    fn both_stores_open_the_same_calendar_window() {
        for store in ["table", "memory"] {
            let p = format!("pt_month_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 3, '1 month', algorithm => 'calendar_window', \
                 time_zone => 'Europe/Paris', store => '{store}')"
            ))
            .expect("policy");
            let figures: Vec<String> = [
                format!("SELECT remaining::text FROM rate_limit.take('{p}', 'k', 2)"),
                format!("SELECT remaining::text FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT allowed::text FROM rate_limit.take('{p}', 'k')"),
                // the window ends at the next first of the month in Paris, to the second
                format!(
                    "SELECT (abs(extract(epoch FROM clock_timestamp() + d.reset_after - \
                       (date_trunc('month', clock_timestamp() AT TIME ZONE 'Europe/Paris') + interval '1 month') \
                       AT TIME ZONE 'Europe/Paris')) < 1)::text \
                     FROM rate_limit.peek('{p}', 'k') AS d"
                ),
                format!(
                    "SELECT (d.retry_after = d.reset_after)::text FROM rate_limit.take('{p}', 'k') AS d"
                ),
                format!("SELECT tokens::text FROM rate_limit.buckets WHERE policy = '{p}'"),
                format!("SELECT algorithm FROM rate_limit.buckets WHERE policy = '{p}'"),
            ]
            .iter()
            .map(|q| text(q).unwrap_or_default())
            .collect();
            assert_eq!(
                figures,
                [
                    "1",
                    "0",
                    "false",
                    "true",
                    "true",
                    "0.000000",
                    "calendar_window"
                ],
                "{store}"
            );
        }
    }

    /// The same acquires and releases give the same figures in both stores.
    #[pg_test]
    fn both_stores_lease_alike() {
        for store in ["table", "memory"] {
            let p = format!("pt_lease_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 2, '1 hour', algorithm => 'concurrency', store => '{store}')"
            ))
            .expect("policy");
            let first = int(&format!("SELECT lease FROM rate_limit.acquire('{p}', 'k')"));
            let figures: Vec<String> = [
                format!("SELECT concat_ws(',', allowed, remaining, lease IS NOT NULL) FROM rate_limit.acquire('{p}', 'k')"),
                format!("SELECT concat_ws(',', allowed, remaining, lease IS NULL, ceil(extract(epoch FROM retry_after))) FROM rate_limit.acquire('{p}', 'k')"),
                format!("SELECT rate_limit.release('{p}', 'k', {first})::text"),
                format!("SELECT rate_limit.release('{p}', 'k', {first})::text"),
                format!("SELECT concat_ws(',', allowed, remaining) FROM rate_limit.acquire('{p}', 'k')"),
                format!("SELECT count(*)::text FROM rate_limit.buckets WHERE policy = '{p}' AND tokens = 0"),
                format!("SELECT concat_ws(',', calls, granted, denied) FROM rate_limit.stats WHERE policy = '{p}'"),
            ]
            .iter()
            .map(|q| text(q).unwrap_or_default())
            .collect();
            assert_eq!(
                figures,
                ["t,0,t", "f,0,t,3600", "true", "false", "t,0", "2", "4,3,1"],
                "{store}"
            );
        }
    }

    /// In a read-only transaction the table store's acquire reads only: denied while every slot is held,
    /// 25006 when one is free (the grant would write).
    #[pg_test]
    fn a_read_only_acquire_is_denied_or_refused_with_25006() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_lease_ro', 1, '1 hour', algorithm => 'concurrency', store => 'table')",
        )
        .expect("policy");
        Spi::run("SELECT rate_limit.acquire('pt_lease_ro', 'held')").expect("a lease");
        assert_eq!(error_of("SELECT 1"), None); // creates the helper while writes are allowed
        Spi::run("SET LOCAL transaction_read_only = on").expect("read only");
        assert_eq!(
            text("SELECT allowed::text FROM rate_limit.acquire('pt_lease_ro', 'held')").as_deref(),
            Some("false")
        );
        let e =
            text("SELECT pg_temp.error_of('SELECT rate_limit.acquire(''pt_lease_ro'', ''free'')')");
        assert!(e.is_some_and(|e| e.starts_with("25006")));
    }

    /// The same denials and blocks give the same figures in both stores: the penalty box blocks at its
    /// limit, a blocked key is denied with the block's end without its bucket being touched (peek, take,
    /// acquire), a block by hand replaces it, and unblock lifts it once.
    #[pg_test]
    fn both_stores_block_alike() {
        for store in ["table", "memory"] {
            let p = format!("pt_block_{store}");
            let l = format!("pt_block_lease_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 2, '1 hour', block_after => 2, \
                 block_for => '1 day', store => '{store}')"
            ))
            .expect("policy");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{l}', 1, '1 hour', algorithm => 'concurrency', \
                 store => '{store}')"
            ))
            .expect("lease policy");
            // one statement each: a statement does not see the rows its own earlier calls wrote
            let figures: Vec<String> = [
                format!("SELECT remaining::text FROM rate_limit.take('{p}', 'k', 2)"),
                format!("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT concat_ws(',', allowed, remaining, ceil(extract(epoch FROM retry_after)), ceil(extract(epoch FROM reset_after)), policy) FROM rate_limit.peek('{p}', 'k')"),
                format!("SELECT string_agg(concat_ws(':', algorithm, floor(tokens)), ',' ORDER BY algorithm) FROM rate_limit.buckets WHERE policy = '{p}'"),
                format!("SELECT rate_limit.unblock('{p}', 'k')::text"),
                format!("SELECT rate_limit.unblock('{p}', 'k')::text"),
                // the bucket is as the block found it: still empty, refilling
                format!("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('{p}', 'k')"),
                format!("SELECT concat_ws(',', allowed, remaining, ceil(extract(epoch FROM retry_after))) FROM rate_limit.block('{p}', 'other', '90 seconds')"),
                format!("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('{p}', 'other')"),
                format!("SELECT count(*)::text FROM rate_limit.buckets WHERE policy = '{p}' AND key = 'other' AND algorithm <> 'block'"),
                format!("SELECT ceil(extract(epoch FROM retry_after))::text FROM rate_limit.block('{l}', 'k', '1 minute')"),
                format!("SELECT concat_ws(',', allowed, lease IS NULL, ceil(extract(epoch FROM retry_after))) FROM rate_limit.acquire('{l}', 'k')"),
                format!("SELECT count(*)::text FROM rate_limit.buckets WHERE policy = '{l}'"),
            ]
            .iter()
            .map(|q| text(q).unwrap_or_default())
            .collect();
            assert_eq!(
                figures,
                [
                    "0",
                    "f,1800",
                    "f,86400",
                    "f,0,86400,86400,{p}".replace("{p}", &p).as_str(),
                    "block:0,token_bucket:0",
                    "true",
                    "false",
                    "f,1800",
                    "f,0,90",
                    "f,90",
                    "0",
                    "60",
                    "f,t,60",
                    "1",
                ],
                "{store}"
            );
        }
    }

    /// In a read-only transaction the table store denies as usual but cannot count the denial in the
    /// penalty box (it would write): nothing is raised, and nothing is counted.
    #[pg_test]
    fn a_read_only_denial_is_not_counted() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_block_ro', 1, '1 hour', block_after => 1, \
             block_for => '1 hour', store => 'table')",
        )
        .expect("policy");
        Spi::run("SELECT rate_limit.take('pt_block_ro', 'k')").expect("first grant");
        Spi::run("SET LOCAL transaction_read_only = on").expect("read only");
        assert_eq!(
            text("SELECT concat_ws(',', allowed, ceil(extract(epoch FROM retry_after))) FROM rate_limit.take('pt_block_ro', 'k')").as_deref(),
            Some("f,3600")
        );
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.buckets WHERE policy = 'pt_block_ro'"),
            1
        );
    }

    /// Under shadow mode a blocked key's calls are allowed and reported as would-be denials with the
    /// block's end, without touching its bucket; the penalty box counts would-be denials, so a key that
    /// enforcing the policy would block shows as blocked.
    #[pg_test]
    fn shadow_mode_reports_blocks_without_enforcing_them() {
        Spi::run(
            "SELECT rate_limit.create_policy('pt_block_shadow', 1, '1 hour', block_after => 1, \
             block_for => '1 day', shadow => true, store => 'memory')",
        )
        .expect("policy");
        let figures: Vec<String> = [
            "SELECT concat_ws(',', allowed, shadow_denied) FROM rate_limit.take('pt_block_shadow', 'k')",
            // a would-be denial, counted: the key would now be blocked for a day
            "SELECT concat_ws(',', allowed, shadow_denied, ceil(extract(epoch FROM reset_after))) FROM rate_limit.take('pt_block_shadow', 'k')",
            "SELECT concat_ws(',', allowed, shadow_denied, ceil(extract(epoch FROM reset_after))) FROM rate_limit.take('pt_block_shadow', 'k')",
            // block() returns what a call on the key gets now: under shadow mode, allowed with the block
            // reported as a would-be denial
            "SELECT concat_ws(',', allowed, remaining, shadow_denied, ceil(extract(epoch FROM reset_after))) FROM rate_limit.block('pt_block_shadow', 'other', '1 minute')",
            "SELECT concat_ws(',', allowed, shadow_denied, ceil(extract(epoch FROM reset_after))) FROM rate_limit.take('pt_block_shadow', 'other')",
            "SELECT count(*)::text FROM rate_limit.buckets WHERE policy = 'pt_block_shadow' AND key = 'other'",
        ]
        .iter()
        .map(|q| text(q).unwrap_or_default())
        .collect();
        assert_eq!(
            figures,
            ["t,f", "t,t,86400", "t,t,86400", "t,0,t,60", "t,t,60", "1"]
        );
    }
}
