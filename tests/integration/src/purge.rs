//! What the tests of the purge (the background worker's and `rate_limit.purge_idle()`) share: a record of
//! every row deleted from the state table with the transaction that deleted it, and a key kept in use
//! while the purge runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use postgres::Client;

/// Makes every row deleted from `rate_limit.bucket_state` recorded in `public.purged` (namespace, key, and
/// the id of the deleting transaction), whoever deletes it (the trigger function runs as the deleting
/// role, which PUBLIC's INSERT lets record).
pub const RECORD_DELETIONS: &str = "CREATE TABLE public.purged (namespace text, key text, xact bigint);
     GRANT INSERT ON public.purged TO PUBLIC;
     CREATE FUNCTION public.note_purged() RETURNS trigger LANGUAGE plpgsql AS
       $$ BEGIN INSERT INTO public.purged VALUES (OLD.namespace, OLD.key, txid_current()); RETURN OLD; END $$;
     CREATE TRIGGER note_purged AFTER DELETE ON rate_limit.bucket_state
       FOR EACH ROW EXECUTE FUNCTION public.note_purged();";

/// How many transactions deleted the rows [`RECORD_DELETIONS`] recorded, and the most rows one of them did.
pub fn deleting_transactions(client: &mut Client) -> (i64, i64) {
    let r = client
        .query_one(
            "SELECT count(*), coalesce(max(n), 0) \
             FROM (SELECT xact, count(*) AS n FROM public.purged GROUP BY xact) t",
            &[],
        )
        .expect("deletions per transaction");
    (r.get(0), r.get(1))
}

/// A connection taking from one key of a policy every 20 ms until [`KeyInUse::stop`], each call asserted
/// granted (the policy refills the key between calls).
pub struct KeyInUse {
    stop: Arc<AtomicBool>,
    caller: JoinHandle<u32>,
}

impl KeyInUse {
    /// Starts calling `rate_limit.take(policy, key)` on `client`.
    pub fn start(mut client: Client, policy: &'static str, key: &'static str) -> KeyInUse {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let caller = thread::spawn(move || {
            let mut calls = 0;
            while !stopped.load(Ordering::Relaxed) {
                let allowed: bool = client
                    .query_one(
                        "SELECT allowed FROM rate_limit.take($1, $2)",
                        &[&policy, &key],
                    )
                    .expect("every call is answered during purges")
                    .get(0);
                assert!(allowed, "the key in use refills between calls");
                calls += 1;
                thread::sleep(Duration::from_millis(20));
            }
            calls
        });
        KeyInUse { stop, caller }
    }

    /// Stops the calls; how many there were.
    pub fn stop(self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        self.caller.join().expect("the key's caller")
    }
}

/// Asserts what [`RECORD_DELETIONS`] recorded of a purge that ran while [`KeyInUse`] called key `hot`:
/// that key's row never deleted, the `idle` idle buckets (keys `idle1`...) each deleted, by transactions of
/// at most 1 000 rows (one span each), so at least `idle / 1000` of them.
pub fn assert_idle_deleted_span_by_span(client: &mut Client, idle: i64) {
    let count = |client: &mut Client, query: &str| -> i64 {
        client.query_one(query, &[]).expect(query).get(0)
    };
    assert_eq!(
        count(
            client,
            "SELECT count(*) FROM public.purged WHERE key = 'hot'"
        ),
        0,
        "the bucket in use was deleted"
    );
    assert_eq!(
        count(
            client,
            "SELECT count(DISTINCT key) FROM public.purged WHERE key LIKE 'idle%'"
        ),
        idle
    );
    let (transactions, most) = deleting_transactions(client);
    assert!(
        most <= 1000 && transactions >= idle / 1000,
        "{transactions} transactions deleted the {idle} idle buckets, up to {most} rows each"
    );
}
