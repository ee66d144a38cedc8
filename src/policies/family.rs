//! Hierarchies of policies (option `parent`): which policies may be parent and child, checked when one is
//! created or changed, and the children that keep a parent from being dropped.
//!
//! A call on a child takes from its own bucket of a key and from its parent's bucket of the *same* key,
//! all or nothing (`crate::api::lineage`): a tenant's key shares one pool among the kinds of work its
//! child policies limit, each capped by its own numbers. The rules, and why:
//! - **One level.** A parent has no parent and a child has no children: a call takes at most two buckets
//!   per policy named, so a `take_many` of [`rate_limit_model::target::MAX_TARGETS`] buckets stays one
//!   memory-store call. Deeper trees (org, team, user) have a key per level: `take_many` names them.
//! - **Both limit tokens.** A concurrency policy's buckets are lease slots, not tokens (42809).
//! - **One store.** All or nothing holds within one store only (0A000, as `take_many`'s).
//! - **At most [`MAX_CHILDREN`] children.** A bound on what a parent's sharing reads (22023).
//! - **A parent outlives its children.** Dropping it while a child names it is refused (2BP01).
//!
//! The checks lock the parent's row (`FOR UPDATE`), so two sessions cannot both add a seventeenth
//! child, and a drop of the parent waits for a child being created and then sees it.

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::spi::Spi;
use pgrx::PgSqlErrorCode;

use super::{parse_store, unknown, Lock, Row};
use crate::error;
use rate_limit_model::algorithm::Algorithm;

/// The most children one parent may have.
pub const MAX_CHILDREN: usize = 16;

/// A child as the checks read it: its name, algorithm and store.
struct Child {
    name: String,
    algorithm: Option<String>,
    store: Option<String>,
}

/// Checks `row` (about to be written by `create_policy` or `alter_policy`) against its parent and its
/// children, locking the parent's row: 42704 for a parent that does not exist, 42809 when either limits
/// leases, 0A000 for two stores, 22023 for a second level or a parent with [`MAX_CHILDREN`] children.
pub fn check(function: &'static str, row: &Row) -> Result<(), ErrorReport> {
    if row.parent.as_deref() == Some(row.name.as_str()) {
        return Err(error::invalid_value(
            function,
            format!(
                "policy {} cannot be its own parent",
                error::quoted(&row.name)
            ),
            "Name another policy as its parent, or null for none.",
        ));
    }
    let children = children_of(function, &row.name)?;
    if !children.is_empty() {
        if row.parent.is_some() {
            return Err(two_levels(function, &row.name, &children[0].name));
        }
        if row.algorithm == Algorithm::Concurrency {
            return Err(leases_in_family(function, &row.name));
        }
        for child in &children {
            let store = child
                .store
                .as_deref()
                .map(|s| parse_store(function, s))
                .transpose()?;
            if store != row.store {
                return Err(two_stores(function, &child.name, &row.name));
            }
            if child.algorithm.as_deref() == Some(Algorithm::Concurrency.name()) {
                return Err(leases_in_family(function, &child.name));
            }
        }
    }
    let Some(parent) = row.parent.as_deref() else {
        return Ok(());
    };
    let (parent_row, _) = Row::read(function, parent, Lock::ForUpdate)?
        .ok_or_else(|| unknown(function, parent).set_hint(PARENT_HINT))?;
    if let Some(grandparent) = parent_row.parent.as_deref() {
        return Err(two_levels(function, parent, grandparent));
    }
    if row.algorithm == Algorithm::Concurrency {
        return Err(leases_in_family(function, &row.name));
    }
    if parent_row.algorithm == Algorithm::Concurrency {
        return Err(leases_in_family(function, parent));
    }
    if parent_row.store != row.store {
        return Err(two_stores(function, &row.name, parent));
    }
    let siblings = children_of(function, parent)?;
    if !siblings.iter().any(|s| s.name == row.name) && siblings.len() >= MAX_CHILDREN {
        return Err(error::invalid_value(
            function,
            format!(
                "policy {} has {MAX_CHILDREN} children, the most a parent may have",
                error::quoted(parent)
            ),
            "Give some of the children another parent, or limit them with take_many over two keys.",
        ));
    }
    Ok(())
}

/// 2BP01 when a policy names `name` as its parent (from `drop_policy`, after its row is deleted, so a
/// child created meanwhile is seen).
pub fn refuse_orphans(function: &'static str, name: &str) -> Result<(), ErrorReport> {
    let children = children_of(function, name)?;
    let Some(child) = children.first() else {
        return Ok(());
    };
    Err(ErrorReport::new(
        PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
        format!(
            "policy {} has {} children ({} first)",
            error::quoted(name),
            children.len(),
            error::quoted(&child.name)
        ),
        function,
    )
    .set_hint("Drop the children first, or give them another parent: alter_policy(child, options => '{\"parent\": null}')."))
}

/// What a parent must be, for hints.
const PARENT_HINT: &str =
    "Create the parent first with rate_limit.create_policy, or see rate_limit.policies.";

/// The policies whose parent is `name` (at most [`MAX_CHILDREN`] + 1 are read), by name.
fn children_of(function: &'static str, name: &str) -> Result<Vec<Child>, ErrorReport> {
    let args: [DatumWithOid<'_>; 1] = [name.into()];
    Spi::connect(|client| {
        let table = client.select(
            "SELECT name, algorithm, store FROM rate_limit.policies \
             WHERE parent OPERATOR(pg_catalog.=) $1 ORDER BY name COLLATE pg_catalog.\"C\" LIMIT 17",
            None,
            &args,
        )?;
        table
            .map(|row| {
                Ok(Child {
                    name: row.get::<String>(1)?.unwrap_or_default(),
                    algorithm: row.get(2)?,
                    store: row.get(3)?,
                })
            })
            .collect::<Result<Vec<Child>, pgrx::spi::SpiError>>()
    })
    .map_err(|e| error::internal(function, e))
}

/// 22023: policy `middle` would be both a child (of `parent`, or of the policy being written) and a
/// parent (of `child`).
fn two_levels(function: &'static str, middle: &str, related: &str) -> ErrorReport {
    error::invalid_value(
        function,
        format!(
            "policy {} would be both a parent and a child (of or with {}); a hierarchy has one level",
            error::quoted(middle),
            error::quoted(related)
        ),
        "Give every child the top policy as its parent; limit deeper trees (org, team, user) with \
         take_many over their keys.",
    )
}

/// 42809: a concurrency policy cannot be a parent or a child.
fn leases_in_family(function: &'static str, name: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        format!(
            "policy {} limits leases held at once, not tokens: it can be neither a parent nor a child",
            error::quoted(name)
        ),
        function,
    )
    .set_hint("Parents and children limit tokens; hold leases with a concurrency policy of its own.")
}

/// 0A000: `child` and `parent` keep their buckets in different stores.
fn two_stores(function: &'static str, child: &str, parent: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!(
            "policy {} and its parent {} must keep their buckets in the same store",
            error::quoted(child),
            error::quoted(parent)
        ),
        function,
    )
    .set_detail("All-or-nothing consumption is atomic within one store only.")
    .set_hint("Give both the same store (create_policy's store argument).")
}
