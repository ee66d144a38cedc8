//! Which policies are gone, for the memory store, which keys a policy's buckets by its incarnation's tag
//! ([`super::memory::policy_tag`]) and cannot see the policies table.
//!
//! A drop (a `DELETE` or `TRUNCATE` of `rate_limit.policies`, through `drop_policy` or not) records the
//! policy in `rate_limit.dropped_policies` from a trigger, in the dropping transaction (`sql/finalize.sql`).
//! Only a committed drop is visible here, so a drop rolled back frees nothing, and a policy created by a
//! transaction still open (its buckets may exist already) is never taken for a dropped one. The tags of
//! live policies are subtracted: two incarnations sharing a 32-bit tag (odds about n² / 2³³ for n
//! policies) leave the dropped one's buckets to be purged when full, never free a live policy's.

use std::collections::{HashMap, HashSet};

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::{Spi, SpiError, SpiTupleTable};

use super::memory::policy_tag;
use crate::error;

/// The tags of `(name, created_at)` rows of a query.
fn tags_of(rows: SpiTupleTable<'_>) -> Result<Vec<(u32, String)>, SpiError> {
    let mut tags = Vec::new();
    for row in rows {
        let name: Option<String> = row.get(1)?;
        let created: Option<TimestampWithTimeZone> = row.get(2)?;
        if let (Some(name), Some(created)) = (name, created) {
            tags.push((policy_tag(&name, created.into_inner()), name));
        }
    }
    Ok(tags)
}

/// The live policies of this database by tag.
pub(super) fn live_policy_tags(
    function: &'static str,
) -> Result<HashMap<u32, String>, ErrorReport> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT name, created_at FROM rate_limit.policies",
            None,
            &[],
        )?;
        Ok::<_, SpiError>(tags_of(rows)?.into_iter().collect())
    })
    .map_err(|e| error::internal(function, e))
}

/// The tags of the policies whose drop has committed and that no live policy shares. The records are
/// deleted in the caller's transaction (kept in a read-only one, such as on a standby: freeing is
/// idempotent, the primary deletes them).
pub(super) fn take_dropped_policy_tags(function: &'static str) -> Result<Vec<u32>, ErrorReport> {
    // SAFETY: XactReadOnly is a plain global of the backend, read on the backend's only thread.
    let read_only = unsafe { pg_sys::XactReadOnly };
    let dropped = Spi::connect_mut(|client| {
        let rows = if read_only {
            client.select(
                "SELECT name, created_at FROM rate_limit.dropped_policies",
                None,
                &[],
            )?
        } else {
            client.update(
                "DELETE FROM rate_limit.dropped_policies RETURNING name, created_at",
                None,
                &[],
            )?
        };
        tags_of(rows)
    })
    .map_err(|e| error::internal(function, e))?;
    if dropped.is_empty() {
        return Ok(Vec::new());
    }
    let live: HashSet<u32> = live_policy_tags(function)?.into_keys().collect();
    Ok(dropped
        .into_iter()
        .map(|(tag, _)| tag)
        .filter(|tag| !live.contains(tag))
        .collect())
}
