//! The SQL surface's table (`src/surface.rs`) against what is written by hand elsewhere, without a
//! server: the reference's index and sections, and the untyped-parameter client test. (The catalog is
//! checked by a `#[pg_test]`, the router's list by `plproxy.rs`, Citus's by being made from the table.)

use rate_limit_integration::surface::{Access, Use, FUNCTIONS};

fn read(path: &str) -> String {
    let file = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The anchor GitHub gives a heading: lower case, spaces to hyphens, other punctuation dropped.
fn anchor(heading: &str) -> String {
    let text: String = heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .collect();
    format!("#{}", text.replace(' ', "-"))
}

/// How a function is called in SQL text: `rate_limit.take(`, or `rate_limiting_request(`.
fn called_as(name: &str) -> String {
    if name == "rate_limiting_request" {
        format!("{name}(")
    } else {
        format!("rate_limit.{name}(")
    }
}

#[test]
fn every_documented_function_has_its_section_and_a_row_in_the_index() {
    let reference = read("docs/reference.md");
    let anchors: Vec<String> = reference
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(anchor)
        .collect();
    let index: Vec<&str> = reference
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| ["))
        .collect();
    for f in FUNCTIONS {
        let Some(doc) = f.doc else { continue };
        assert!(
            anchors.iter().any(|a| a == doc),
            "{}: docs/reference.md has no section {doc}",
            f.name
        );
        let who = match (f.access, f.purpose) {
            (Access::Public, Use::UserTrigger) => "any table owner",
            (Access::Public, _) => "any role",
            (Access::Owner, _) => "owner",
            (Access::Monitor, _) => "owner and pg_monitor",
        };
        let row = index
            .iter()
            .find(|row| {
                row.contains(&format!("]({doc})"))
                    && row.split('|').nth(1).is_some_and(|names| {
                        names.contains(&format!("`{}", called_as(f.name)))
                            || names.contains(&format!("`{}(", f.name))
                            || names.contains(&format!("`{}`", f.name))
                            || names.contains(&format!("`rate_limit.{}`", f.name))
                    })
            })
            .unwrap_or_else(|| {
                panic!(
                    "{}: the index of docs/reference.md has no row naming it and linking {doc}",
                    f.name
                )
            });
        assert_eq!(
            row.split('|').nth(3).map(str::trim),
            Some(who),
            "{}: who may call it, in the index",
            f.name
        );
    }
}

#[test]
fn the_client_test_calls_every_function_users_call() {
    let client_test = read("tests/clients/untyped.test.js");
    let missing: Vec<&str> = FUNCTIONS
        .iter()
        .filter(|f| f.purpose == Use::Call && !client_test.contains(&called_as(f.name)))
        .map(|f| f.name)
        .collect();
    assert!(
        missing.is_empty(),
        "tests/clients/untyped.test.js calls none of {missing:?}"
    );
}
