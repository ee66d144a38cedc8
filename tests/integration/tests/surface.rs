//! The SQL surface's table (`src/surface/`) against what is written by hand elsewhere, without a
//! server: the reference's index and sections, the security reference's table of who may call what, and
//! the untyped-parameter client test; and the SQL made from the table (`generated.rs`) against the files
//! that hold it. (The catalog is checked by a `#[pg_test]`, the router by `plproxy.rs`, Citus's list by
//! being made from the table.)

use rate_limit_integration::generated::{generated, splice};
use rate_limit_integration::surface::{functions, Access, Use};

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
    for f in functions() {
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
    let missing: Vec<&str> = functions()
        .filter(|f| f.purpose == Use::Call && !client_test.contains(&called_as(f.name)))
        .map(|f| f.name)
        .collect();
    assert!(
        missing.is_empty(),
        "tests/clients/untyped.test.js calls none of {missing:?}"
    );
}

/// The SQL made from the table (`generated.rs`: every function's privileges and comment, the CREATE
/// FUNCTION of the functions new in the unreleased version, the router's calls) is what the files hold.
/// `scripts/generate-surface.sh` runs this test with `RATE_LIMIT_WRITE_GENERATED=1`, which writes them.
#[test]
fn the_sql_made_from_the_table_is_in_its_files() {
    let cargo = read("Cargo.toml");
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("Cargo.toml names the version");
    let write = std::env::var("RATE_LIMIT_WRITE_GENERATED").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for made in generated(version) {
        let file = format!("{}/../../{}", env!("CARGO_MANIFEST_DIR"), made.path);
        let now = std::fs::read_to_string(&file).ok();
        let wanted = match (made.markers, made.text) {
            (Some((begin, end)), Some(text)) => {
                let whole = now
                    .as_deref()
                    .unwrap_or_else(|| panic!("{file} is missing"));
                Some(splice(whole, begin, end, &text).unwrap_or_else(|| {
                    panic!("{}: no section from {begin:?} to {end:?}", made.path)
                }))
            }
            (_, text) => text,
        };
        if now == wanted {
            continue;
        }
        if write {
            match wanted {
                Some(text) => std::fs::write(&file, text),
                None => std::fs::remove_file(&file),
            }
            .unwrap_or_else(|e| panic!("{file}: {e}"));
            eprintln!("wrote {}", made.path);
        } else {
            stale.push(made.path);
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} differ from what src/surface/ makes: run scripts/generate-surface.sh"
    );
}

/// The security reference's table of who may call what (docs/security.md) names every function any role
/// may call in its "any role" row, and every function of the owner's in the owner's row.
#[test]
fn the_security_reference_names_who_may_call_each_function() {
    let security = read("docs/security.md");
    let row = |who: &str| -> String {
        security
            .lines()
            .find(|l| l.starts_with(&format!("| {who} |")))
            .unwrap_or_else(|| panic!("docs/security.md has no row for {who}"))
            .to_string()
    };
    let (public, owner) = (
        row("any role"),
        row("the extension owner, and roles it grants"),
    );
    for f in functions().filter(|f| f.purpose == Use::Call) {
        let named = |row: &str| {
            row.contains(&format!("`rate_limit.{}`", f.name))
                || row.contains(&format!("`rate_limit.{}(", f.name))
                || row.contains(&format!("`{}`", f.name))
                || row.contains(&format!("`{}(", f.name))
        };
        match f.access {
            Access::Public => assert!(named(&public), "{}: not in the any-role row", f.name),
            Access::Owner => assert!(named(&owner), "{}: not in the owner's row", f.name),
            Access::Monitor => {}
        }
    }
}
