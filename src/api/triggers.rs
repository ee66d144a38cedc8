//! `rate_limit.limit_writes`: a row trigger that limits writes per key with a named policy.
//!
//! ```sql
//! CREATE TRIGGER comments_rate_limit BEFORE INSERT ON comments
//!     FOR EACH ROW EXECUTE FUNCTION rate_limit.limit_writes('comments_per_user', 'author_id');
//! ```
//!
//! Each row takes `cost` tokens (a third trigger argument, default 1) from the bucket of the row's key
//! column under the policy, in the policy's store; a denied row raises [`DENIED`] with the decision's HTTP
//! header values in DETAIL and the wait in HINT. With the table store the tokens are part of the writing
//! transaction: a rolled-back insert gives them back.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

use super::limits::take_policy;
use crate::decision::Decision;
use crate::policies;
use rate_limit_model::http;

/// The SQLSTATE of a write denied by `limit_writes`: 53400 `configuration_limit_exceeded` (class 53,
/// insufficient resources: the configured rate is used up). PostgREST answers class 53 with 503, which
/// carries `Retry-After` as 429 does.
pub const DENIED: PgSqlErrorCode = PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED;

const F: &str = "rate_limit.limit_writes";

fn misuse(message: String, hint: &str) -> ErrorReport {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
        message,
        F,
    )
    .set_hint(hint.to_string())
}

const USAGE: &str =
    "Use CREATE TRIGGER ... BEFORE INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION \
                     rate_limit.limit_writes('policy', 'key_column' [, 'cost']).";

/// The trigger's arguments: policy name, key column, and the cost of one row.
struct Arguments {
    policy: String,
    column: String,
    cost: i32,
}

fn arguments(trigger: &PgTrigger<'_>) -> Result<Arguments, ErrorReport> {
    let args = trigger
        .extra_args()
        .map_err(|e| misuse(format!("unreadable trigger arguments: {e}"), USAGE))?;
    let (policy, column, cost) = match args.as_slice() {
        [p, c] => (p, c, None),
        [p, c, cost] => (p, c, Some(cost)),
        _ => {
            return Err(misuse(
                format!(
                "limit_writes takes 2 or 3 trigger arguments (policy, key column, cost), got {}",
                args.len()
            ),
                USAGE,
            ))
        }
    };
    let cost = match cost {
        None => 1,
        Some(text) => text
            .trim()
            .parse::<i32>()
            .ok()
            .filter(|c| *c >= 0)
            .ok_or_else(|| {
                ErrorReport::new(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    format!(
                        "cost must be an integer from 0 to {}, got {}",
                        i32::MAX,
                        crate::error::quoted(text)
                    ),
                    F,
                )
                .set_hint("Pass the tokens one row takes as the third trigger argument, e.g. '1'.")
            })?,
    };
    Ok(Arguments {
        policy: policy.clone(),
        column: column.clone(),
        cost,
    })
}

/// The text of column `column` in the row being written; 42703 if the table has no such column, 22004 if
/// it is NULL (a NULL key would let every such row through).
fn key_of(trigger: &PgTrigger<'_>, column: &str) -> Result<String, ErrorReport> {
    let data = trigger.trigger_data();
    let cname = std::ffi::CString::new(column).map_err(|_| {
        misuse(
            "the key column's name contains a NUL byte".to_string(),
            USAGE,
        )
    })?;
    // SAFETY: tg_relation is the open relation the trigger fires on, valid for the whole call; rd_att is
    // its tuple descriptor. The row is tg_newtuple for an UPDATE and tg_trigtuple for an INSERT (checked by
    // the caller), both valid for the call. SPI_fnumber and SPI_getvalue only read them (no SPI connection
    // is needed) and SPI_getvalue returns a string palloc'd in the current memory context, or NULL for a
    // NULL value.
    unsafe {
        let relation = data.tg_relation;
        let desc = (*relation).rd_att;
        let number = pg_sys::SPI_fnumber(desc, cname.as_ptr());
        if number <= 0 {
            let table = trigger.table_name().unwrap_or_default();
            return Err(ErrorReport::new(
                PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!(
                    "table {} has no column {} to limit writes by",
                    crate::error::quoted(&table),
                    crate::error::quoted(column)
                ),
                F,
            )
            .set_hint(
                "Name a column of the table as the second trigger argument (case matters).",
            ));
        }
        let row = if matches!(trigger.op(), Ok(PgTriggerOperation::Update)) {
            data.tg_newtuple
        } else {
            data.tg_trigtuple
        };
        let value = pg_sys::SPI_getvalue(row, desc, number);
        if value.is_null() {
            return Err(ErrorReport::new(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                format!(
                    "column {} is NULL: there is no key to limit this write by",
                    crate::error::quoted(column)
                ),
                F,
            )
            .set_hint(
                "Give the column a value (NOT NULL or a default), or limit by another column.",
            ));
        }
        let key = std::ffi::CStr::from_ptr(value)
            .to_string_lossy()
            .into_owned();
        pg_sys::pfree(value.cast());
        Ok(key)
    }
}

/// The error of a denied write: the decision's header values in DETAIL, the wait in HINT.
fn denied(policy: &str, key: &str, d: &Decision) -> Result<ErrorReport, ErrorReport> {
    let named = policies::get(F, policy)?;
    let fields = http::fields(&http::Input {
        name: Some(policy),
        allowed: d.allowed,
        remaining: d.remaining,
        limit: Some(d.limit),
        retry_after_us: d.retry_after.map(i128::from),
        reset_after_us: d.reset_after.into(),
        policy: Some(named.policy),
    });
    let detail = fields
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(name, value)| format!("{name}: {}", value.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let hint = match d.retry_after {
        Some(us) => format!(
            "Retry after {} second(s), when the bucket holds enough tokens again.",
            (us + 999_999) / 1_000_000
        ),
        None => {
            "This write costs more than the policy's burst: it can never be granted.".to_string()
        }
    };
    Ok(ErrorReport::new(
        DENIED,
        format!(
            "rate limit exceeded: policy {}, key {}",
            crate::error::quoted(policy),
            crate::error::quoted(key)
        ),
        F,
    )
    .set_detail(detail)
    .set_hint(hint))
}

/// Row triggers, in schema `rate_limit`.
#[pg_schema]
mod rate_limit {
    use super::*;

    /// BEFORE INSERT OR UPDATE … FOR EACH ROW trigger: takes `cost` tokens (third argument, default 1)
    /// from the bucket of the row's key column (second argument) under a policy (first argument); a
    /// denied row raises 53400. SECURITY DEFINER (set in `sql/finalize.sql`): writers need no rights on
    /// the extension's tables. Its C entry point is `limit_writes_wrapper` below, which refuses a direct
    /// call with 39P01 before pgrx's wrapper runs.
    #[pg_trigger(sql = r#"
CREATE FUNCTION rate_limit."limit_writes"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'limit_writes_wrapper';
"#)]
    fn limit_writes_row<'a>(
        trigger: &'a PgTrigger<'a>,
    ) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, ErrorReport> {
        // pgrx turns an `Err` of a trigger function into XX000 ("Trigger function panic"): raise the
        // error here instead, which keeps its SQLSTATE, DETAIL and HINT.
        if let Err(e) = limit_row(trigger) {
            e.report(PgLogLevel::ERROR);
        }
        Ok(trigger.new())
    }

    crate::trigger_entry_point!(
        limit_writes_wrapper,
        pg_finfo_limit_writes_wrapper,
        limit_writes_row_wrapper,
        "rate_limit.limit_writes"
    );
}

/// The body of `limit_writes`: checks how it fires, then takes the row's tokens or refuses the row.
fn limit_row(trigger: &PgTrigger<'_>) -> Result<(), ErrorReport> {
    let level_ok = matches!(trigger.level(), PgTriggerLevel::Row);
    let when_ok = matches!(trigger.when(), Ok(PgTriggerWhen::Before));
    let op_ok = matches!(
        trigger.op(),
        Ok(PgTriggerOperation::Insert | PgTriggerOperation::Update)
    );
    if !(level_ok && when_ok && op_ok) {
        return Err(misuse(
            "limit_writes must fire BEFORE INSERT or UPDATE, FOR EACH ROW".to_string(),
            USAGE,
        ));
    }
    let args = arguments(trigger)?;
    let key = key_of(trigger, &args.column)?;
    // SAFETY: tg_relation is the open relation the trigger fires on, valid for the whole call.
    let relation = unsafe { (*trigger.trigger_data().tg_relation).rd_id };
    crate::cluster::citus::ensure_bucket_reachable_from_trigger(F, relation, &key)?;
    let d = take_policy(F, Some(&args.policy), Some(&key), Some(args.cost))?;
    if d.allowed {
        Ok(())
    } else {
        Err(denied(&args.policy, &key, &d)?)
    }
}
