-- A key's block is read only where one can exist: for a policy with a penalty box, or once a key of it was
-- blocked by hand (or its penalty box removed). No policy of 0.3.0 has a block.
ALTER TABLE rate_limit.policies
    ADD COLUMN blocks_by_hand boolean NOT NULL DEFAULT false;
