//! Policy options (`options jsonb` of `create_policy` and `alter_policy`): each is set, kept when left
//! out, cleared by `null`, a column of `rate_limit.policies`; wrong ones are 22023.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::{error_of, int, text};
    use crate::policies::options::OPTIONS;

    fn description(policy: &str) -> Option<String> {
        text(&format!(
            "SELECT description FROM rate_limit.policies WHERE name = '{policy}'"
        ))
    }

    #[pg_test]
    fn an_option_is_set_kept_and_cleared_by_name() {
        Spi::run(
            "SELECT rate_limit.create_policy('opt', 5, '1 minute', \
             options => '{\"description\": \"for the tests\"}')",
        )
        .expect("created");
        assert_eq!(description("opt").as_deref(), Some("for the tests"));
        // another change, and options without it, keep it
        Spi::run("SELECT rate_limit.alter_policy('opt', rate => 7)").expect("altered");
        Spi::run("SELECT rate_limit.alter_policy('opt', options => '{}')").expect("altered");
        assert_eq!(description("opt").as_deref(), Some("for the tests"));
        assert_eq!(
            int("SELECT rate FROM rate_limit.policies WHERE name = 'opt'"),
            7
        );
        Spi::run(
            "SELECT rate_limit.alter_policy('opt', options => \
             jsonb_build_object('description', 'é' || repeat('x', 999)))",
        )
        .expect("1000 characters are taken");
        assert_eq!(description("opt").map(|d| d.chars().count()), Some(1000));
        Spi::run("SELECT rate_limit.alter_policy('opt', options => '{\"description\": null}')")
            .expect("cleared");
        assert_eq!(description("opt"), None);
        // an option changes no decision's numbers: the burst of 5 that rate 7 kept, less one
        assert_eq!(int("SELECT remaining FROM rate_limit.take('opt', 'k')"), 4);
    }

    #[pg_test]
    fn wrong_options_are_22023_and_change_nothing() {
        Spi::run("SELECT rate_limit.create_policy('opt', 5, '1 minute')").expect("created");
        let cases = [
            (
                "'[1]'",
                "22023: options must be a JSON object, got array",
            ),
            (
                "'\"x\"'",
                "22023: options must be a JSON object, got string",
            ),
            (
                "'{\"descripton\": \"x\"}'",
                "22023: unknown policy option \"descripton\"",
            ),
            (
                "'{\"description\": 7}'",
                "22023: policy option \"description\" takes a string of at most 1000 characters, or null, got a number",
            ),
            (
                "jsonb_build_object('description', repeat('x', 1001))",
                "22023: policy option \"description\" takes at most 1000 characters, got 1001",
            ),
        ];
        for (options, expected) in cases {
            for call in [
                format!("SELECT rate_limit.alter_policy('opt', rate => 9, options => {options})"),
                format!(
                    "SELECT rate_limit.create_policy('opt2', 5, '1 minute', options => {options})"
                ),
            ] {
                assert_eq!(error_of(&call).as_deref(), Some(expected), "{call}");
            }
        }
        assert_eq!(
            int("SELECT rate FROM rate_limit.policies WHERE name = 'opt'"),
            5
        );
        assert_eq!(
            int("SELECT count(*) FROM rate_limit.policies WHERE name = 'opt2'"),
            0
        );
        // SQL NULL is no options at all
        Spi::run("SELECT rate_limit.alter_policy('opt', rate => 9, options => NULL)").expect("ran");
        assert_eq!(
            int("SELECT rate FROM rate_limit.policies WHERE name = 'opt'"),
            9
        );
    }

    /// Every option is a column of `rate_limit.policies`, of the name it has in `options`.
    #[pg_test]
    fn every_option_is_a_column_of_the_policies() {
        for o in OPTIONS {
            assert_eq!(
                int(&format!(
                    "SELECT count(*) FROM pg_catalog.pg_attribute \
                     WHERE attrelid = 'rate_limit.policies'::regclass AND attname = '{}' \
                       AND NOT attisdropped",
                    o.name
                )),
                1,
                "{}",
                o.name
            );
        }
    }
}
