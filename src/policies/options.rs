//! Policy options passed by name in one JSON object: `create_policy(…, options => '{"description": "…"}')`
//! and `alter_policy(name, options => …)`. The two functions' typed parameters stay as 0.4.0 made them;
//! every option added after it is one entry of [`OPTIONS`] (its name, what it takes, how it is set on the
//! [`Row`]) beside its column, so adding one changes no signature, no grant, no router and no upgrade
//! script beyond its `ALTER TABLE`. Why JSON and not `VARIADIC` pairs or a composite type: a driver sends an
//! untyped parameter as text, which `jsonb` parses (a composite type would need every field spelt and a new
//! type per option, pairs lose their types), and `jsonb_build_object` builds it in PL/pgSQL.
//!
//! In `alter_policy`, an option left out keeps its value and JSON `null` clears it.

use pgrx::pg_sys::panic::ErrorReport;
use serde_json::Value;

use super::Row;
use crate::error;
use rate_limit_model::meters::{Meters, MetersError, MAX_METERS, MAX_NAME_BYTES, MAX_WEIGHT};

/// One option a policy takes in `options`.
pub struct PolicyOption {
    /// Its name, the JSON object's key.
    pub name: &'static str,
    /// What its value must be, as the hints and the reference say it.
    pub takes: &'static str,
    /// A value it takes, as JSON, for hints.
    example: &'static str,
    /// Sets it on a row from its JSON value (`null` clears it), reading intervals with the [`Readers`]
    /// given; 22023 for a value it does not take.
    set: fn(&'static str, &mut Row, &Value, &Readers) -> Result<(), ErrorReport>,
}

/// How option values are read that only the server can read, passed to the setters rather than called
/// by them, so that the setters (and [`OPTIONS`], which the plain unit tests read) link without PostgreSQL.
pub struct Readers {
    /// A string PostgreSQL reads as an interval (22007 for one it cannot read).
    pub interval: fn(&'static str, &str) -> Result<pgrx::datum::Interval, ErrorReport>,
}

/// The readers of a call inside the server: PostgreSQL's own input functions, through SPI.
const SERVER_READERS: Readers = Readers {
    interval: read_interval,
};

/// `text` read by PostgreSQL as an interval.
fn read_interval(function: &'static str, text: &str) -> Result<pgrx::datum::Interval, ErrorReport> {
    pgrx::spi::Spi::get_one_with_args::<pgrx::datum::Interval>(
        "SELECT $1::pg_catalog.interval",
        &[text.into()],
    )
    .map_err(|e| error::internal(function, e))?
    .ok_or_else(|| error::bug(function, "an interval read as NULL"))
}

/// Every option `options` takes, in the order the reference lists them.
pub const OPTIONS: &[PolicyOption] = &[DESCRIPTION, LATENCY_TARGET, ADAPTIVE_MIN, METERS, PARENT];

/// Free text for the people who run a policy (why it exists, who owns it); no effect on decisions.
const DESCRIPTION: PolicyOption = PolicyOption {
    name: "description",
    takes: "a string of at most 1000 characters, or null",
    example: "\"Partner API, owned by the integrations team\"",
    set: set_description,
};

/// Makes a concurrency policy adaptive: a call slower than this counts as trouble for its key's limit
/// (see [`rate_limit_model::algorithm::adaptive`]).
const LATENCY_TARGET: PolicyOption = PolicyOption {
    name: "latency_target",
    takes: "an interval as a string (a concurrency policy's), or null",
    example: "\"250 milliseconds\"",
    set: set_latency_target,
};

/// The fewest leases an adaptive concurrency policy's limit falls to.
const ADAPTIVE_MIN: PolicyOption = PolicyOption {
    name: "adaptive_min",
    takes: "a whole number of leases from 1 to the policy's rate, or null (1)",
    example: "2",
    set: set_adaptive_min,
};

/// Weighted meters: what a unit of each named quantity costs in tokens, for `reserve`'s and `settle`'s
/// `amounts` (see [`rate_limit_model::meters`]).
const METERS: PolicyOption = PolicyOption {
    name: "meters",
    takes: "an object of up to 16 meter names ([a-z0-9_], at most 63 bytes) and their weights in tokens \
            (0 to 1000000, exact to the millionth), or null",
    example: "{\"input\": 0.2, \"output\": 1}",
    set: set_meters,
};

/// Makes the policy a child of another: a call on it also takes from the parent's bucket of the same key,
/// all or nothing (checked against the other policies by [`super::family::check`]).
const PARENT: PolicyOption = PolicyOption {
    name: "parent",
    takes:
        "the name of another policy that limits tokens, in the same store and without a parent of \
            its own, or null",
    example: "\"tenant\"",
    set: set_parent,
};

/// The most characters of a policy's description.
pub const MAX_DESCRIPTION_CHARS: usize = 1000;

/// Sets on `row` every option of `options` (a JSON object; SQL NULL sets none): 22023 with a hint for
/// something else than an object, an option nobody knows, or a value an option does not take.
pub fn apply(
    function: &'static str,
    row: &mut Row,
    options: Option<&Value>,
) -> Result<(), ErrorReport> {
    let Some(options) = options else {
        return Ok(());
    };
    let Value::Object(given) = options else {
        return Err(error::invalid_value(
            function,
            format!(
                "options must be a JSON object, got {}",
                json_type_name(options)
            ),
            &format!(
                "Pass options by name, e.g. options => '{{\"description\": \"…\"}}'; known options: {}.",
                known()
            ),
        ));
    };
    for (name, value) in given {
        let Some(option) = OPTIONS.iter().find(|o| o.name == name) else {
            return Err(error::invalid_value(
                function,
                format!("unknown policy option \"{}\"", shown(name)),
                &format!("Known options: {}.", known()),
            ));
        };
        (option.set)(function, row, value, &SERVER_READERS)?;
    }
    Ok(())
}

/// The deepest nesting `options` may hold: every option takes a flat value or, `meters`, a flat object,
/// so anything deeper is a mistake, refused before the text is parsed (a `jsonb` may nest 10 000 levels).
pub const MAX_DEPTH: usize = 16;

/// `options` as a `jsonb` argument's text ([`crate::api::json_arg::JsonbText`]) made a JSON value: 22023
/// for values nested deeper than [`MAX_DEPTH`] or numbers beyond what a 64-bit float holds (`1e400`),
/// which `jsonb` accepts and no option takes.
pub fn parse(function: &'static str, text: &str) -> Result<Value, ErrorReport> {
    let depth = nesting(text);
    if depth > MAX_DEPTH {
        return Err(error::invalid_value(
            function,
            format!("options are nested {depth} levels deep; at most {MAX_DEPTH} are accepted"),
            &format!(
                "Pass a flat JSON object of options, e.g. options => '{{\"description\": \"…\"}}'; known options: {}.",
                known()
            ),
        ));
    }
    serde_json::from_str(text).map_err(|e| {
        error::invalid_value(
            function,
            format!("options hold a value no option takes: {e}"),
            &format!(
                "Pass numbers within the range of a double precision value; known options: {}.",
                known()
            ),
        )
    })
}

/// How deeply the arrays and objects of JSON text `text` nest (brackets inside strings do not count).
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The known options' names, for hints.
fn known() -> String {
    OPTIONS
        .iter()
        .map(|o| o.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// At most the first 64 characters of a caller's option name, for a message.
fn shown(name: &str) -> String {
    let mut chars = name.chars();
    let head: String = chars.by_ref().take(64).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

/// The JSON type of `value`, as jsonb_typeof names it.
fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// 22023: option `option` does not take `value`.
fn wrong_value(function: &'static str, option: &PolicyOption, value: &Value) -> ErrorReport {
    error::invalid_value(
        function,
        format!(
            "policy option \"{}\" takes {}, got a {}",
            option.name,
            option.takes,
            json_type_name(value)
        ),
        &format!(
            "Pass e.g. options => '{{\"{}\": {}}}'.",
            option.name, option.example
        ),
    )
}

/// Sets [`DESCRIPTION`].
fn set_description(
    function: &'static str,
    row: &mut Row,
    value: &Value,
    _: &Readers,
) -> Result<(), ErrorReport> {
    row.description = match value {
        Value::Null => None,
        Value::String(s) if s.chars().count() <= MAX_DESCRIPTION_CHARS => Some(s.clone()),
        Value::String(s) => {
            return Err(error::invalid_value(
                function,
                format!(
                    "policy option \"description\" takes at most {MAX_DESCRIPTION_CHARS} characters, got {}",
                    s.chars().count()
                ),
                "Shorten it; link to a longer text if needed.",
            ))
        }
        other => return Err(wrong_value(function, &DESCRIPTION, other)),
    };
    Ok(())
}

/// Sets [`LATENCY_TARGET`]: a string PostgreSQL reads as an interval (22007 for one it cannot read).
fn set_latency_target(
    function: &'static str,
    row: &mut Row,
    value: &Value,
    readers: &Readers,
) -> Result<(), ErrorReport> {
    row.latency_target = match value {
        Value::Null => None,
        Value::String(s) => Some((readers.interval)(function, s)?),
        other => return Err(wrong_value(function, &LATENCY_TARGET, other)),
    };
    Ok(())
}

/// Sets [`ADAPTIVE_MIN`] (its range is checked with the policy's rate, [`super::checked`]).
fn set_adaptive_min(
    function: &'static str,
    row: &mut Row,
    value: &Value,
    _: &Readers,
) -> Result<(), ErrorReport> {
    row.adaptive_min = match value {
        Value::Null => None,
        Value::Number(n) => Some(
            n.as_i64()
                .ok_or_else(|| wrong_value(function, &ADAPTIVE_MIN, value))?,
        ),
        other => return Err(wrong_value(function, &ADAPTIVE_MIN, other)),
    };
    Ok(())
}

/// Sets [`PARENT`]: a string that can name a policy ([`super::check_name`]); which policy it names is
/// checked by [`super::family::check`].
fn set_parent(
    function: &'static str,
    row: &mut Row,
    value: &Value,
    _: &Readers,
) -> Result<(), ErrorReport> {
    row.parent = match value {
        Value::Null => None,
        Value::String(s) => {
            super::check_name(function, s)?;
            Some(s.clone())
        }
        other => return Err(wrong_value(function, &PARENT, other)),
    };
    Ok(())
}

/// Sets [`METERS`]: 22023 naming what is wrong with them.
fn set_meters(
    function: &'static str,
    row: &mut Row,
    value: &Value,
    _: &Readers,
) -> Result<(), ErrorReport> {
    if value.is_null() {
        row.meters = None;
        return Ok(());
    }
    row.meters = Some(Meters::from_json(value).map_err(|e| {
        let message = match e {
            MetersError::NotAnObject(t) => {
                format!("policy option \"meters\" must be a JSON object, got {t}")
            }
            MetersError::Empty => "policy option \"meters\" names no meter".to_string(),
            MetersError::TooMany(n) => format!(
                "policy option \"meters\" names {n} meters; at most {MAX_METERS} are accepted"
            ),
            MetersError::BadName(name) => format!(
                "meter name \"{name}\" must be 1 to {MAX_NAME_BYTES} bytes of a-z, 0-9 and _"
            ),
            MetersError::BadWeight(name, weight) => format!(
                "meter \"{name}\" must weigh 0 to {MAX_WEIGHT} tokens exact to the millionth, got {weight}"
            ),
        };
        error::invalid_value(
            function,
            message,
            &format!(
                "Pass e.g. options => '{{\"meters\": {}}}', or null to remove them.",
                METERS.example
            ),
        )
    })?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_names_are_unique_lowercase_identifiers() {
        for (i, o) in OPTIONS.iter().enumerate() {
            assert!(
                o.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{}",
                o.name
            );
            assert!(OPTIONS[..i].iter().all(|p| p.name != o.name), "{}", o.name);
        }
    }

    /// The reference's table of options has a row for each, saying what it takes.
    #[test]
    fn the_reference_lists_every_option() {
        let reference = include_str!("../../docs/reference.md");
        for o in OPTIONS {
            let row = format!("| `{}` | {} |", o.name, o.takes.replace("null", "`null`"));
            assert!(reference.contains(&row), "docs/reference.md lacks: {row}");
        }
    }

    #[test]
    fn nesting_counts_brackets_outside_strings() {
        assert_eq!(nesting(r#"{"description": "[[{{"}"#), 1);
        assert_eq!(nesting(r#"{"a": [1, {"b": "\\\"[["}]}"#), 3);
        assert_eq!(nesting("1"), 0);
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(nesting(&deep), 200);
    }

    #[test]
    fn long_names_are_cut_in_messages() {
        assert_eq!(shown("abc"), "abc");
        assert_eq!(shown(&"x".repeat(65)), format!("{}…", "x".repeat(64)));
    }
}
