use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::*;

fn llm() -> Meters {
    Meters::from_json(&json!({"input": 0.2, "output": 1, "cached_input": 0.05})).expect("meters")
}

/// A weight in millionths as JSON, as a user writes it.
fn weight_json(millionths: i64) -> Value {
    if millionths % UNITS == 0 {
        json!(millionths / UNITS)
    } else {
        json!(millionths as f64 / UNITS as f64)
    }
}

#[test]
fn a_cost_is_the_weighted_sum_rounded_up_to_a_whole_token() {
    let m = llm();
    assert_eq!(m.tokens(&json!({"input": 1000, "output": 300})), Ok(500));
    assert_eq!(
        m.tokens(&json!({"input": 1})),
        Ok(1),
        "0.2 of a token is charged as one"
    );
    assert_eq!(m.tokens(&json!({"input": 5})), Ok(1));
    assert_eq!(m.tokens(&json!({"input": 6})), Ok(2));
    assert_eq!(m.tokens(&json!({"cached_input": 20, "input": 0})), Ok(1));
    assert_eq!(
        m.tokens(&json!({})),
        Ok(0),
        "nothing measured costs nothing"
    );
    assert_eq!(m.tokens(&json!({"output": 12.0})), Ok(12), "12.0 is whole");
    assert_eq!(
        m.tokens(&json!({"output": i64::MAX})),
        Ok(i64::MAX),
        "the largest amount at weight 1"
    );
    assert_eq!(
        m.tokens(&json!({"output": i64::MAX, "input": 5})),
        Err(AmountsError::TooLarge)
    );
}

#[test]
fn weights_are_exact_to_the_millionth() {
    let m = Meters::from_json(&json!({"a": 0.000001, "b": 999999.999999, "c": 1000000, "d": 0}))
        .expect("meters");
    assert_eq!(m.tokens(&json!({"a": 1_000_000})), Ok(1));
    assert_eq!(m.tokens(&json!({"a": 1_000_001})), Ok(2));
    assert_eq!(m.tokens(&json!({"b": 1_000_000})), Ok(999_999_999_999));
    assert_eq!(m.tokens(&json!({"c": 3})), Ok(3_000_000));
    assert_eq!(m.tokens(&json!({"d": 123_456})), Ok(0), "a free meter");
    let refused = [
        json!(0.0000001),
        json!(0.1234567),
        json!(1000000.5),
        json!(1000001),
        json!(-1),
        json!(-0.5),
        json!("1"),
        json!(null),
        json!(true),
        json!([1]),
        json!({"x": 1}),
    ];
    for weight in refused {
        assert!(
            matches!(
                Meters::from_json(&json!({ "a": weight.clone() })),
                Err(MetersError::BadWeight(..))
            ),
            "{weight}"
        );
    }
}

#[test]
fn meters_are_a_small_object_of_plain_names() {
    assert_eq!(
        Meters::from_json(&json!([1])),
        Err(MetersError::NotAnObject("array"))
    );
    assert_eq!(Meters::from_json(&json!({})), Err(MetersError::Empty));
    let many: Map<String, Value> = (0..17).map(|i| (format!("m{i}"), json!(1))).collect();
    assert_eq!(
        Meters::from_json(&Value::Object(many)),
        Err(MetersError::TooMany(17))
    );
    let sixteen: Map<String, Value> = (0..16).map(|i| (format!("m{i}"), json!(1))).collect();
    assert!(Meters::from_json(&Value::Object(sixteen)).is_ok());
    let long = "x".repeat(64);
    for bad in ["", "Input", "in put", "in-put", "ü", long.as_str()] {
        assert!(
            matches!(
                Meters::from_json(&json!({ bad: 1 })),
                Err(MetersError::BadName(_))
            ),
            "{bad:?}"
        );
    }
    assert!(Meters::from_json(&json!({ "x".repeat(63): 1 })).is_ok());
}

#[test]
fn amounts_name_known_meters_with_whole_amounts() {
    let m = llm();
    assert_eq!(
        m.tokens(&json!({"inputs": 1})),
        Err(AmountsError::Unknown("inputs".into())),
        "a typo is refused, not settled for free"
    );
    assert_eq!(
        m.tokens(&json!(5)),
        Err(AmountsError::NotAnObject("number"))
    );
    for bad in [json!(-1), json!(1.5), json!("3"), json!(null), json!(1e300)] {
        assert!(
            matches!(
                m.tokens(&json!({ "input": bad.clone() })),
                Err(AmountsError::BadAmount(..))
            ),
            "{bad}"
        );
    }
    assert_eq!(
        m.names().collect::<Vec<_>>(),
        ["cached_input", "input", "output"]
    );
}

#[test]
fn meters_read_back_what_they_write() {
    let m = llm();
    assert_eq!(
        m.to_json(),
        json!({"cached_input": 0.05, "input": 0.2, "output": 1})
    );
    assert_eq!(Meters::from_json(&m.to_json()), Ok(m));
}

proptest! {
    /// Any weight exact to the millionth is read exactly, and a cost is the exact weighted sum rounded up:
    /// never less, less than one token more.
    #[test]
    fn the_cost_is_the_exact_sum_rounded_up(
        weights in prop::collection::vec(0i64..=MAX_WEIGHT * UNITS, 1..=MAX_METERS),
        amounts in prop::collection::vec(0i64..=1_000_000_000, MAX_METERS),
    ) {
        let meters: Map<String, Value> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| (format!("m{i}"), weight_json(*w)))
            .collect();
        let m = Meters::from_json(&Value::Object(meters)).expect("meters");
        let given: Map<String, Value> = (0..weights.len())
            .map(|i| (format!("m{i}"), json!(amounts[i])))
            .collect();
        let exact: i128 = weights
            .iter()
            .zip(&amounts)
            .map(|(w, a)| i128::from(*w) * i128::from(*a))
            .sum();
        let tokens = i128::from(m.tokens(&Value::Object(given)).expect("a cost"));
        prop_assert!(tokens * i128::from(UNITS) >= exact);
        prop_assert!(tokens == 0 || (tokens - 1) * i128::from(UNITS) < exact);
    }

    /// More of any meter never costs less.
    #[test]
    fn more_never_costs_less(a in 0i64..1_000_000, b in 0i64..1_000_000, more in 0i64..1_000) {
        let m = llm();
        let less = m.tokens(&json!({"input": a, "output": b})).expect("cost");
        let more_input = m.tokens(&json!({"input": a + more, "output": b})).expect("cost");
        let more_output = m.tokens(&json!({"input": a, "output": b + more})).expect("cost");
        prop_assert!(more_input >= less);
        prop_assert!(more_output >= less);
    }
}
