//! A key's block bucket is read only where a block can exist: for a policy with a penalty box, or once a
//! key of the policy was blocked by hand (or its penalty box removed); the decisions are the same.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{int, text};
    use crate::store::block_reads;

    /// The block reads of `n` takes of `key` under `policy`, and whether the last was allowed.
    fn takes(policy: &str, key: &str, n: usize) -> (u64, bool) {
        let before = block_reads();
        let mut allowed = false;
        for _ in 0..n {
            allowed = text(&format!(
                "SELECT allowed::text FROM rate_limit.take('{policy}', '{key}')"
            ))
            .as_deref()
                == Some("true");
        }
        (block_reads() - before, allowed)
    }

    fn blocks_by_hand(policy: &str) -> bool {
        text(&format!(
            "SELECT blocks_by_hand::text FROM rate_limit.policies WHERE name = '{policy}'"
        ))
        .as_deref()
            == Some("true")
    }

    #[pg_test]
    fn a_policy_nobody_blocked_reads_no_block_in_the_table_store() {
        Spi::run(
            "SELECT rate_limit.create_policy('br_plain', 100, '1 minute', store => 'table'); \
             SELECT rate_limit.create_policy('br_box', 100, '1 minute', store => 'table', \
                                             block_after => 5, block_for => '1 hour')",
        )
        .expect("policies");
        assert_eq!(takes("br_plain", "k", 3), (0, true));
        assert_eq!(takes("br_box", "k", 3), (3, true));
        // take_many over policies nobody blocked reads no block either
        let before = block_reads();
        assert_eq!(
            text(
                "SELECT allowed::text FROM rate_limit.take_many(ARRAY['br_plain', 'br_plain'], ARRAY['a', 'b'])"
            )
            .as_deref(),
            Some("true")
        );
        assert_eq!(block_reads() - before, 0);

        // a block by hand notes it in the policy; from then on its keys' blocks are read, and enforced
        assert!(!blocks_by_hand("br_plain"));
        Spi::run("SELECT rate_limit.block('br_plain', 'bad', '1 hour')").expect("block");
        assert!(blocks_by_hand("br_plain"));
        assert_eq!(takes("br_plain", "bad", 1), (1, false));
        assert_eq!(takes("br_plain", "k", 1), (1, true));
        Spi::run("SELECT rate_limit.unblock('br_plain', 'bad')").expect("unblock");
        assert_eq!(takes("br_plain", "bad", 1), (1, true));
    }

    /// Removing a penalty box leaves the blocks it made in place until their end: the policy then reads
    /// its keys' blocks as for blocks by hand. (Memory buckets outlive a test's rolled-back transaction: no
    /// bucket of these tests refills within minutes, so none is full for the purge test running beside.)
    #[pg_test]
    fn a_removed_penalty_box_keeps_its_blocks() {
        for store in ["table", "memory"] {
            let p = format!("br_removed_{store}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 1, '1 hour', store => '{store}', \
                 block_after => 1, block_for => '1 day')"
            ))
            .expect("policy");
            assert!(takes(&p, "k", 1).1);
            assert!(!takes(&p, "k", 1).1); // the denial that starts the block
            Spi::run(&format!(
                "SELECT rate_limit.alter_policy('{p}', rate => 2, block_after => 0)"
            ))
            .expect("penalty box removed");
            assert!(blocks_by_hand(&p), "{store}");
            let retry = int(&format!(
                "SELECT extract(epoch FROM retry_after)::bigint FROM rate_limit.take('{p}', 'k')"
            ));
            assert!(retry > 86_000, "{store}: still blocked, {retry} s left");
        }
    }

    /// The memory store notes a block by hand at once, whatever the caller's transaction does next (as it
    /// keeps the block): a policy's row would forget a note its ROLLBACK undid.
    #[pg_test]
    fn a_block_by_hand_in_the_memory_store_is_read_from_then_on() {
        Spi::run("SELECT rate_limit.create_policy('br_mem', 100, '1 day', store => 'memory')")
            .expect("policy");
        Spi::run("SELECT rate_limit.block('br_mem', 'bad', '1 hour')").expect("block");
        assert!(
            !blocks_by_hand("br_mem"),
            "noted in shared memory, not the row"
        );
        assert_eq!(takes("br_mem", "bad", 1), (1, false));
        assert_eq!(takes("br_mem", "k", 1), (1, true));
    }

    /// A block by hand in the memory store makes its own policy read its keys' blocks, not every policy:
    /// of ten policies nobody blocked, at most a couple whose bit another policy's block by hand shares
    /// (one bit of 1 024 per policy, across every test of this server) read a block.
    #[pg_test]
    fn a_block_by_hand_in_the_memory_store_leaves_other_policies_alone() {
        Spi::run("SELECT rate_limit.create_policy('br_mem_a', 100, '1 day', store => 'memory')")
            .expect("policy");
        Spi::run("SELECT rate_limit.block('br_mem_a', 'bad', '1 hour')").expect("block");
        assert_eq!(takes("br_mem_a", "k", 2), (2, true));
        let mut reading = 0;
        for i in 0..10 {
            let p = format!("br_mem_other_{i}");
            Spi::run(&format!(
                "SELECT rate_limit.create_policy('{p}', 100, '1 day', store => 'memory')"
            ))
            .expect("policy");
            let (reads, allowed) = takes(&p, "bad", 2);
            assert!(allowed, "{p}: another policy's block does not apply");
            if reads > 0 {
                reading += 1;
            }
        }
        assert!(reading <= 2, "{reading} of 10 policies read blocks");
    }

    /// The memory store saves which policies may hold a block by hand with its buckets: the bitmap in the
    /// saved file is the store's own, so that a restart does not make every policy read blocks (loading it
    /// is `HandBlocks::restore`, tested with the bitmap's unit tests).
    #[pg_test]
    fn the_memory_store_saves_which_policies_were_blocked_by_hand() {
        Spi::run("SELECT rate_limit.create_policy('br_saved', 100, '1 day', store => 'memory')")
            .expect("policy");
        Spi::run("SELECT rate_limit.block('br_saved', 'bad', '1 hour')").expect("block");
        let (before, _) = crate::store::hand_blocks_now_and_saved();
        assert!(before.iter().any(|w| *w != 0), "the block is noted");
        crate::store::save_memory();
        let (after, saved) = crate::store::hand_blocks_now_and_saved();
        let saved = saved.expect("a saved store of the current format");
        // other tests may block keys by hand meanwhile: every bit set before the save is saved, and only
        // bits set by the time it was read back
        let within =
            |small: &[u64], large: &[u64]| small.iter().zip(large).all(|(s, l)| s & !l == 0);
        assert!(within(&before, &saved), "{before:x?} not all in {saved:x?}");
        assert!(within(&saved, &after), "{saved:x?} not all in {after:x?}");
    }
}
