//! The SQL made from the surface's table (`src/surface/`), so that a function is declared once: every
//! function's privileges and comment (a section of `sql/finalize.sql`, which the unreleased upgrade script
//! repeats), the CREATE FUNCTION of the functions new in the unreleased version (an upgrade fragment), and
//! the PL/Proxy router's list of forwarded calls (a section of `router/plproxy.sql`).
//!
//! The test `surface` (tests/surface.rs) checks that the files hold exactly this; `scripts/generate-surface.sh`
//! runs it with `RATE_LIMIT_WRITE_GENERATED=1`, which writes them instead.

use crate::surface::{functions, Access, Body, Function, Route, Schema};

/// A file, or a section of one between two marker lines, that is made from the table.
pub struct Generated {
    /// The file, from the repository's root.
    pub path: &'static str,
    /// The section's first and last lines (kept in the file), or `None` for a whole file.
    pub markers: Option<(&'static str, &'static str)>,
    /// What it holds; `None` for a whole file that must not exist (no function is new).
    pub text: Option<String>,
}

/// The first line of the generated section of `sql/finalize.sql`.
pub const FINALIZE_BEGIN: &str =
    "-- BEGIN made from src/surface/ by scripts/generate-surface.sh: every function's privileges and comment";
/// Its last line.
pub const FINALIZE_END: &str = "-- END made from src/surface/";
/// The first line of the router's generated list of calls.
const ROUTER_BEGIN: &str = "  -- BEGIN made from src/surface/ by scripts/generate-surface.sh";
/// Its last line.
const ROUTER_END: &str = "  -- END made from src/surface/";
/// The upgrade fragment with the functions new in the unreleased version.
pub const NEW_FUNCTIONS: &str = "sql/unreleased/000-new-functions.sql";

/// Everything made from the table, for the unreleased version `version` (`Cargo.toml`'s).
pub fn generated(version: &str) -> Vec<Generated> {
    vec![
        Generated {
            path: "sql/finalize.sql",
            markers: Some((FINALIZE_BEGIN, FINALIZE_END)),
            text: Some(privileges_and_comments()),
        },
        Generated {
            path: NEW_FUNCTIONS,
            markers: None,
            text: new_functions(version),
        },
        Generated {
            path: "router/plproxy.sql",
            markers: Some((ROUTER_BEGIN, ROUTER_END)),
            text: Some(router_calls()),
        },
    ]
}

/// The function as statements name it: with its schema, or bare in the extension's (which is first on
/// the search_path while CREATE EXTENSION and ALTER EXTENSION UPDATE run).
fn sql_name(f: &Function) -> String {
    match f.schema {
        Schema::Extension => f.name.to_string(),
        Schema::RateLimit => format!("rate_limit.{}", f.name),
    }
}

/// A SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Every function's privileges (PUBLIC keeps the EXECUTE it has by default; the owner's functions are
/// revoked from it; the monitoring functions granted to pg_monitor) and comment, in the table's order.
pub fn privileges_and_comments() -> String {
    let mut sql = String::new();
    for f in functions() {
        let function = format!("{}({})", sql_name(f), f.arguments);
        let kind = f.sql_kind();
        if matches!(f.access, Access::Owner | Access::Monitor) {
            sql += &format!("REVOKE EXECUTE ON {kind} {function} FROM PUBLIC;\n");
        }
        if f.access == Access::Monitor {
            sql += &format!("GRANT EXECUTE ON {kind} {function} TO pg_monitor;\n");
        }
        sql += &format!(
            "COMMENT ON {kind} {function} IS\n    {};\n",
            literal(f.comment)
        );
    }
    sql
}

/// The upgrade fragment creating the library's functions first created by `version`, as pgrx's schema
/// does for a fresh install (the upgrade test compares their definitions); `None` when there are none.
/// Their privileges and comments come at the end of the upgrade script, with every function's.
pub fn new_functions(version: &str) -> Option<String> {
    let mut sql = format!(
        "-- The functions new in {version}, made from src/surface/ by scripts/generate-surface.sh (do not\n\
         -- edit): each as pgrx's schema creates it. Their privileges and comments end the upgrade script.\n"
    );
    let mut any = false;
    for f in functions().filter(|f| f.since == version) {
        let Body::C { symbol, attributes } = f.body else {
            continue; // written in SQL: its fragment creates it
        };
        any = true;
        sql += &format!(
            "CREATE FUNCTION {}({}) RETURNS {}\n    {attributes} LANGUAGE c AS 'MODULE_PATHNAME', {};\n",
            sql_name(f),
            f.parameters,
            f.result,
            literal(symbol)
        );
    }
    any.then_some(sql)
}

/// How the router routes a forwarded call: a key expression, `ALL` or `ANY`.
fn route_of(f: &Function) -> Option<String> {
    match f.route {
        Route::KeysPartition => Some(format!(
            "pg_catalog.hashtext({})",
            f.key.expect("a call routed by its key names its key")
        )),
        Route::FirstKeysPartition => Some("rate_limit_router.first_key_hash(keys)".to_string()),
        Route::EveryPartition => Some("ALL".to_string()),
        Route::AnyPartition => Some("ANY".to_string()),
        Route::NotForwarded => None,
    }
}

/// The rows of the router's `calls()`: every forwarded function with its schema on the router, its
/// parameters, the arguments passed on, its result, its route, and its kind (`owner` for the owner's,
/// `take` for a call that takes tokens, `read` for the others).
pub fn router_calls() -> String {
    let rows: Vec<String> = functions()
        .filter_map(|f| {
            let route = route_of(f)?;
            assert!(
                !f.result.starts_with("TABLE("),
                "{}: the router forwards no function returning a table",
                f.name
            );
            let schema = match f.schema {
                Schema::Extension => "public",
                Schema::RateLimit => "rate_limit",
            };
            let kind = match (f.access, f.takes_tokens) {
                (Access::Owner | Access::Monitor, _) => "owner",
                (Access::Public, true) => "take",
                (Access::Public, false) => "read",
            };
            Some(format!(
                "  ({}, {}, {},\n   {}, {}, {}, {})",
                literal(f.name),
                literal(schema),
                literal(f.parameters),
                literal(&f.parameter_names().join(", ")),
                literal(f.result),
                literal(&route),
                literal(kind)
            ))
        })
        .collect();
    rows.join(",\n") + "\n"
}

/// `file` with the text between `begin` and `end` replaced by `text`; `None` if a marker is missing.
pub fn splice(file: &str, begin: &str, end: &str, text: &str) -> Option<String> {
    let start = file.find(&format!("{begin}\n"))? + begin.len() + 1;
    let stop = start + file[start..].find(&format!("{end}\n"))?;
    Some(format!("{}{text}{}", &file[..start], &file[stop..]))
}
