//! `rate_limit.take_batch(policy, keys, costs, all_or_nothing)`: decisions for many keys of one policy in
//! one statement (queue consumers, batch jobs), one row per key in the order given.
//!
//! Each key is decided as `take(policy, key, cost)` would decide it, in the order of the array, through the
//! same seam (blocks, penalty boxes, shadow mode, statistics): a key named twice is taken twice. Only the
//! per-call work is paid once: the policy's lookup, the arguments' checks, the function call and its
//! result row. Keys are independent unless `all_or_nothing` asks otherwise; then the batch is one
//! `take_many` over its keys (at most [`MAX_TARGETS`] distinct keys, one cost), granted whole or not at all.
//! Why that bound: an all-or-nothing call holds every bucket it names at once (the memory store's
//! partition locks, the table store's row locks), and one caller holding thousands would stall every other
//! caller of those partitions.

use pgrx::fcinfo::{pg_getarg, pg_getarg_datum};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::Array;

use std::collections::HashMap;

use super::family::no_parent;
use super::materialized::Materialized;
use super::{policy_arg, policy_target, store_of, with_override};
use crate::error::{self, MAX_ID_BYTES};
use crate::policies::{overrides, Named};
use crate::store;
use rate_limit_model::algorithm::Outcome;
use rate_limit_model::target::{granted, Target, MAX_TARGETS};

/// The elements of the `keys` array as it holds them: each element's value (a text datum pointing into the
/// array, passed on to its result row without a copy) and its text, `None` for a NULL element.
///
/// # Safety
/// `array` is a non-NULL `text[]` argument of the current call; the elements live as long as the call's
/// memory context, which `'k` must not outlive.
unsafe fn key_elements<'k>(
    function: &'static str,
    array: pg_sys::Datum,
) -> Result<Vec<Option<(pg_sys::Datum, &'k str)>>, ErrorReport> {
    // SAFETY: a text[] argument's datum is a (possibly toasted) array; the detoasted copy is valid for
    // the call.
    let array =
        unsafe { pg_sys::pg_detoast_datum(array.cast_mut_ptr()) }.cast::<pg_sys::ArrayType>();
    // SAFETY: the array's header and its dimensions (ndim int4 right after the header, ARR_DIMS) lie
    // inside the detoasted array.
    let count = unsafe {
        let dims = array
            .cast::<u8>()
            .add(size_of::<pg_sys::ArrayType>())
            .cast::<i32>();
        pg_sys::ArrayGetNItems((*array).ndim, dims)
    };
    crate::bounds::batch_size(function, usize::try_from(count).unwrap_or(usize::MAX))?;
    let (mut datums, mut nulls, mut n) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
    // SAFETY: text is a variable-length (-1), by-reference type aligned on 4 bytes ('i'); the output
    // arrays are allocated by deconstruct_array in the current memory context, n elements each.
    let (datums, nulls) = unsafe {
        pg_sys::deconstruct_array(
            array,
            pg_sys::TEXTOID,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
            &mut datums,
            &mut nulls,
            &mut n,
        );
        let n = usize::try_from(n).unwrap_or(0);
        (
            std::slice::from_raw_parts(datums, n),
            std::slice::from_raw_parts(nulls, n),
        )
    };
    let mut elements = Vec::with_capacity(datums.len());
    for (&datum, &null) in datums.iter().zip(nulls) {
        // SAFETY: a non-NULL element of a text[] is a text datum, valid for the call.
        let text = unsafe { <&'k str as FromDatum>::from_datum(datum, null) };
        elements.push(text.map(|t| (datum, t)));
    }
    Ok(elements)
}

/// The keys of a batch, validated: no NULL element, at most [`crate::bounds::MAX_BATCH`] keys of at most
/// [`MAX_ID_BYTES`] bytes each (an empty array is an empty batch).
fn keys_arg<'k>(
    function: &'static str,
    elements: &[Option<(pg_sys::Datum, &'k str)>],
) -> Result<Vec<&'k str>, ErrorReport> {
    let mut valid = Vec::with_capacity(elements.len());
    for (i, element) in elements.iter().enumerate() {
        let (_, key) = element.ok_or_else(|| {
            error::null_argument(
                function,
                &format!("keys[{}]", i + 1),
                "Every element of keys must be a key; filter NULLs out first.",
            )
        })?;
        if key.len() > MAX_ID_BYTES {
            return Err(error::key_too_long(function, "keys", key.len()));
        }
        valid.push(key);
    }
    Ok(valid)
}

/// The cost of each key: 1 each when `costs` is NULL, else one cost (0 or more) per key.
fn costs_arg(
    function: &'static str,
    costs: Option<Array<'_, i32>>,
    keys: usize,
) -> Result<Vec<i64>, ErrorReport> {
    let Some(costs) = costs else {
        return Ok(vec![1; keys]);
    };
    if costs.len() != keys {
        return Err(error::invalid_value(
            function,
            format!("costs holds {} values but keys holds {keys}", costs.len()),
            "Pass one cost per key in the same order, or NULL for 1 each.",
        ));
    }
    let mut valid = Vec::with_capacity(keys);
    for (i, cost) in costs.iter().enumerate() {
        let argument = format!("costs[{}]", i + 1);
        let cost = cost.ok_or_else(|| {
            error::null_argument(function, &argument, "Pass 0 or more tokens for every key.")
        })?;
        if cost < 0 {
            return Err(error::out_of_range(
                function,
                &argument,
                cost.into(),
                0,
                i32::MAX.into(),
            ));
        }
        valid.push(i64::from(cost));
    }
    Ok(valid)
}

/// Every key decided on its own: one outcome per key, `outcomes[i]` for `keys[i]` (see
/// [`store::take_each`] for the order each store takes them in).
fn take_each(
    function: &'static str,
    named: &Named,
    keys: &[&str],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    let store = store_of(Some(named));
    let overridden = if overrides::any(function, named)? {
        overrides::of_keys(function, named, keys)?
    } else {
        HashMap::new()
    };
    if overridden.is_empty() {
        let template = with_override(named, "", None);
        return store::take_each(function, store, &template, keys, costs);
    }
    // the keys without an override are decided together, as ever; then each key with one, as `take`
    // decides it, in key order: every batch takes its rows in the order (overridden or not, key), so two
    // batches never wait for each other's rows in a circle
    let (with, without): (Vec<usize>, Vec<usize>) =
        (0..keys.len()).partition(|&i| overridden.contains_key(keys[i]));
    let template = with_override(named, "", None);
    let plain_keys: Vec<&str> = without.iter().map(|&i| keys[i]).collect();
    let plain_costs: Vec<i64> = without.iter().map(|&i| costs[i]).collect();
    let plain = store::take_each(function, store, &template, &plain_keys, &plain_costs)?;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; keys.len()];
    for (&i, o) in without.iter().zip(plain) {
        outcomes[i] = Some(o);
    }
    let mut with = with;
    with.sort_by_key(|&i| (keys[i], i));
    for i in with {
        let t = with_override(named, keys[i], overridden.get(keys[i]));
        outcomes[i] = store::take(function, store, std::slice::from_ref(&t), costs[i])?
            .first()
            .copied();
    }
    outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| error::bug(function, "a batch lost a key's outcome")))
        .collect()
}

/// The keys decided together, all or nothing: at most [`MAX_TARGETS`] distinct keys and one cost; every
/// row says whether the batch was granted.
fn take_all_or_nothing(
    function: &'static str,
    named: &Named,
    keys: &[&str],
    costs: &[i64],
) -> Result<Vec<Outcome>, ErrorReport> {
    if keys.len() > MAX_TARGETS {
        return Err(error::invalid_value(
            function,
            format!(
                "an all-or-nothing batch names at most {MAX_TARGETS} keys, got {}",
                keys.len()
            ),
            "Hold fewer buckets at once: split the batch, or pass all_or_nothing => false.",
        ));
    }
    let cost = costs.first().copied().unwrap_or(1);
    if costs.iter().any(|&c| c != cost) {
        return Err(error::invalid_value(
            function,
            "an all-or-nothing batch takes one cost from every key".to_string(),
            "Pass the same cost for every key, or all_or_nothing => false.",
        ));
    }
    let targets = keys
        .iter()
        .map(|k| policy_target(function, named, k))
        .collect::<Result<Vec<Target<'_>>, ErrorReport>>()?;
    if let Some((i, _)) = keys
        .iter()
        .enumerate()
        .find(|(i, k)| keys[..*i].contains(k))
    {
        return Err(error::invalid_value(
            function,
            format!(
                "key \"{}\" is named twice in an all-or-nothing batch",
                keys[i]
            ),
            "Name each key once; pass a higher cost to take more tokens.",
        ));
    }
    let store = store_of(Some(named));
    let mut outcomes = store::take(function, store, &targets, cost)?.into_vec();
    if granted(&targets, &outcomes) {
        return Ok(outcomes);
    }
    // nothing was taken: the keys that would have granted report what they hold (a denied call may not
    // even have looked at them), each read as `peek` reads it alone (read together, a blocked key among
    // them would report the others as not looked at, with nothing left: found by the differential test)
    for (i, t) in targets.iter().enumerate() {
        if outcomes[i].allowed {
            if let Some(&o) = store::take(function, store, std::slice::from_ref(t), 0)?.first() {
                outcomes[i] = o;
            }
        }
    }
    for o in &mut outcomes {
        o.allowed = false;
    }
    Ok(outcomes)
}

/// Decides the batch of the call's arguments (see [`entry_point`]): its keys and their outcomes.
fn take_batch<'k>(
    function: &'static str,
    policy: Option<&str>,
    keys: &[Option<(pg_sys::Datum, &'k str)>],
    costs: Option<Array<'_, i32>>,
    all_or_nothing: Option<bool>,
) -> Result<(Vec<&'k str>, Vec<Outcome>), ErrorReport> {
    let named = policy_arg(function, policy)?;
    no_parent(function, &named, "take_batch")?;
    let keys = keys_arg(function, keys)?;
    let costs = costs_arg(function, costs, keys.len())?;
    let all_or_nothing = all_or_nothing.ok_or_else(|| {
        error::null_argument(
            function,
            "all_or_nothing",
            "Pass true to grant the batch whole or not at all, false to decide each key.",
        )
    })?;
    let outcomes = if keys.is_empty() {
        Vec::new()
    } else if all_or_nothing {
        take_all_or_nothing(function, &named, &keys, &costs)?
    } else {
        take_each(function, &named, &keys, &costs)?
    };
    Ok((keys, outcomes))
}

/// The rows of a batch (`outcomes[i]` is that of `keys[i]`, whose text datum in the call's array is
/// `elements[i]`) into the call's materialized result.
fn push_rows(
    rows: &mut Materialized,
    elements: &[Option<(pg_sys::Datum, &str)>],
    outcomes: &[Outcome],
) {
    for (i, (element, o)) in elements.iter().zip(outcomes).enumerate() {
        let wait = o
            .retry_after
            .filter(|_| !o.allowed)
            .map(|us| pg_sys::Interval {
                time: us,
                day: 0,
                month: 0,
            });
        let mut values = [
            pg_sys::Datum::from(i as i32 + 1),
            // the key's own text in the call's array (decided keys are never NULL)
            element.map_or(pg_sys::Datum::from(0), |(datum, _)| datum),
            pg_sys::Datum::from(o.allowed),
            pg_sys::Datum::from(o.remaining),
            wait.as_ref().map_or(pg_sys::Datum::from(0), |w| {
                pg_sys::Datum::from(std::ptr::from_ref(w))
            }),
        ];
        let mut nulls = [false, element.is_none(), false, false, wait.is_none()];
        // the row is copied into the tuplestore: `wait` may go after this
        rows.push(&mut values, &mut nulls);
    }
}

/// The V1 calling-convention record of [`entry_point`].
#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_take_batch_wrapper() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// The C entry point of `rate_limit.take_batch` (declared by the `extension_sql!` below): decides the
/// batch, then hands its rows to the executor at once ([`Materialized`]).
///
/// # Safety
/// Called by PostgreSQL with a valid `fcinfo` for the SQL signature declared below.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn take_batch_wrapper(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    const F: &str = "rate_limit.take_batch";
    // SAFETY: the arguments are those of the declared signature (text, text[], int[], boolean), read with
    // their Rust types; the arrays and text are detoasted into the current memory context, valid for
    // the call.
    let (policy, keys, costs, all_or_nothing) = unsafe {
        (
            pg_getarg::<&str>(fcinfo, 0),
            pg_getarg_datum(fcinfo, 1),
            pg_getarg::<Array<'_, i32>>(fcinfo, 2),
            pg_getarg::<bool>(fcinfo, 3),
        )
    };
    let run = || -> Result<(), ErrorReport> {
        let keys = keys.ok_or_else(|| {
            error::null_argument(
                F,
                "keys",
                "Pass an array of keys, e.g. ARRAY['user1', 'user2'].",
            )
        })?;
        // SAFETY: argument 1 is the call's non-NULL text[]; the elements are used within the call only.
        let elements = unsafe { key_elements(F, keys) }?;
        let (keys, outcomes) = take_batch(F, policy, &elements, costs, all_or_nothing)?;
        // SAFETY: fcinfo is this call's, and the declared result is a row type (RETURNS TABLE).
        let mut rows =
            unsafe { Materialized::begin(fcinfo, F, crate::bounds::batch_result_kb(&keys)) }?;
        push_rows(&mut rows, &elements, &outcomes);
        Ok(())
    };
    if let Err(e) = run() {
        e.report(PgLogLevel::ERROR);
    }
    pg_sys::Datum::from(0)
}

extension_sql!(
    r#"
CREATE FUNCTION rate_limit."take_batch"(
	"policy" TEXT,
	"keys" TEXT[],
	"costs" INT[] DEFAULT NULL,
	"all_or_nothing" bool DEFAULT false
) RETURNS TABLE (
	"ordinality" INT,
	"key" TEXT,
	"allowed" bool,
	"remaining" bigint,
	"retry_after" interval
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'take_batch_wrapper';
"#,
    name = "take_batch"
);
