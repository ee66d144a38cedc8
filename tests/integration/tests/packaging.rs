//! The channels a user finds rate_limit through: PGXN's META.json is valid under the PGXN meta spec
//! (v1, checked with its own JSON schemas) and names this version, the files it points to exist, and the
//! portable edition's control file installs this version.

use std::path::Path;

fn repository(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn cargo_version() -> String {
    repository("Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the version in Cargo.toml")
        .to_string()
}

#[test]
fn meta_json_is_valid_pgxn_metadata_of_this_version() {
    let meta: serde_json::Value =
        serde_json::from_str(&repository("META.json")).expect("META.json is JSON");
    let mut validator = pgxn_meta::valid::Validator::new();
    if let Err(e) = validator.validate(&meta) {
        panic!("META.json is not valid under the PGXN meta spec: {e}");
    }
    let version = cargo_version();
    assert_eq!(
        meta["version"],
        version.as_str(),
        "the distribution's version"
    );
    let provides = meta["provides"].as_object().expect("provides");
    assert_eq!(
        provides.keys().collect::<Vec<_>>(),
        ["rate_limit", "rate_limit_portable"]
    );
    for (name, extension) in provides {
        assert_eq!(extension["version"], version.as_str(), "{name}");
        for field in ["file", "docfile"] {
            let path = extension[field].as_str().expect(field);
            assert!(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../..")
                    .join(path)
                    .exists(),
                "{name}: {field} {path} does not exist"
            );
        }
    }
}

#[test]
fn the_portable_control_file_installs_this_version() {
    let control = repository("portable/rate_limit_portable.control");
    assert!(
        control.contains(&format!("default_version = '{}'", cargo_version())),
        "{control}"
    );
    assert!(control.contains("superuser = false"), "{control}");
}
