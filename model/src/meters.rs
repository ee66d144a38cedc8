//! Weighted meters: a policy's named quantities and what one unit of each costs in tokens, so that work
//! measured in several quantities (an LLM call's input and output tokens, a query's rows and bytes) is
//! reserved and settled in one token budget: `{"input": 0.2, "output": 1}` makes 1 000 input tokens and
//! 300 output tokens cost `0.2 × 1000 + 1 × 300 = 500` tokens.
//!
//! A weight is exact to the millionth of a token (a weight with more digits is refused, not rounded), from
//! 0 (a quantity counted but free) to [`MAX_WEIGHT`]; a cost is rounded up to a whole token, so that work is
//! never charged less than its weighted amounts. A policy has at most [`MAX_METERS`] meters, each named by
//! 1 to [`MAX_NAME_BYTES`] bytes of lowercase letters, digits and `_`. Amounts are whole and never
//! negative; a meter left out counts 0, one the policy does not have is refused (a typo would otherwise
//! settle for free).

use serde_json::{Map, Value};

/// Millionths of a token: the unit of a weight.
pub const UNITS: i64 = 1_000_000;

/// The most meters a policy has.
pub const MAX_METERS: usize = 16;

/// The longest name of a meter, in bytes.
pub const MAX_NAME_BYTES: usize = 63;

/// The most one unit of a meter costs, in tokens.
pub const MAX_WEIGHT: i64 = 1_000_000;

/// A policy's meters, by name (sorted), each with its weight in millionths of a token per unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meters {
    meters: Vec<(String, i64)>,
}

/// Why a policy's meters were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetersError {
    /// Not a JSON object (the JSON type's name).
    NotAnObject(&'static str),
    /// An object without a meter.
    Empty,
    /// More than [`MAX_METERS`] meters (how many).
    TooMany(usize),
    /// A name that is not 1 to [`MAX_NAME_BYTES`] bytes of `[a-z0-9_]`.
    BadName(String),
    /// A weight that is not a number from 0 to [`MAX_WEIGHT`] exact to the millionth (the meter, the value).
    BadWeight(String, String),
}

/// Why the amounts of a call were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AmountsError {
    /// Not a JSON object (the JSON type's name).
    NotAnObject(&'static str),
    /// A meter the policy does not have.
    Unknown(String),
    /// An amount that is not a whole number from 0 to 2^63 - 1 (the meter, the value).
    BadAmount(String, String),
    /// A cost beyond 2^63 - 1 tokens.
    TooLarge,
}

impl Meters {
    /// The meters of a JSON object of names and weights.
    pub fn from_json(value: &Value) -> Result<Meters, MetersError> {
        let Value::Object(given) = value else {
            return Err(MetersError::NotAnObject(json_type(value)));
        };
        if given.is_empty() {
            return Err(MetersError::Empty);
        }
        if given.len() > MAX_METERS {
            return Err(MetersError::TooMany(given.len()));
        }
        let mut meters = Vec::with_capacity(given.len());
        for (name, weight) in given {
            if !valid_name(name) {
                return Err(MetersError::BadName(name.chars().take(80).collect()));
            }
            let millionths = weight_millionths(weight)
                .ok_or_else(|| MetersError::BadWeight(name.clone(), short(weight)))?;
            meters.push((name.clone(), millionths));
        }
        meters.sort();
        Ok(Meters { meters })
    }

    /// The meters as a JSON object of names and weights (what [`Meters::from_json`] reads back).
    pub fn to_json(&self) -> Value {
        let mut object = Map::new();
        for (name, millionths) in &self.meters {
            let weight = if millionths % UNITS == 0 {
                Value::from(millionths / UNITS)
            } else {
                Value::from(*millionths as f64 / UNITS as f64)
            };
            object.insert(name.clone(), weight);
        }
        Value::Object(object)
    }

    /// The meters' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.meters.iter().map(|(n, _)| n.as_str())
    }

    /// The tokens `amounts` (a JSON object of meter names and whole amounts) cost: the sum of each amount
    /// times its meter's weight, rounded up to a whole token.
    pub fn tokens(&self, amounts: &Value) -> Result<i64, AmountsError> {
        let Value::Object(given) = amounts else {
            return Err(AmountsError::NotAnObject(json_type(amounts)));
        };
        let mut millionths: i128 = 0;
        for (name, amount) in given {
            let weight = self
                .meters
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
                .map(|i| self.meters[i].1)
                .map_err(|_| AmountsError::Unknown(name.chars().take(80).collect()))?;
            let amount = whole_amount(amount)
                .ok_or_else(|| AmountsError::BadAmount(name.clone(), short(amount)))?;
            // at most 16 × 2^63 × 10^12: far inside an i128
            millionths += i128::from(weight) * i128::from(amount);
        }
        let tokens = (millionths + i128::from(UNITS) - 1) / i128::from(UNITS);
        i64::try_from(tokens).map_err(|_| AmountsError::TooLarge)
    }
}

/// Whether `name` is 1 to [`MAX_NAME_BYTES`] bytes of `[a-z0-9_]`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A weight in millionths: a JSON number from 0 to [`MAX_WEIGHT`] with at most six decimals.
fn weight_millionths(weight: &Value) -> Option<i64> {
    let Value::Number(n) = weight else {
        return None;
    };
    if let Some(whole) = n.as_i64() {
        return (0..=MAX_WEIGHT).contains(&whole).then_some(whole * UNITS);
    }
    let w = n.as_f64()?;
    if !(0.0..=MAX_WEIGHT as f64).contains(&w) {
        return None;
    }
    let scaled = w * UNITS as f64;
    let millionths = scaled.round();
    // a decimal with at most six places is within a few ulps of a whole number of millionths once scaled
    // (at most 10^12: an ulp is at most 2^-13); one with a seventh is at least a tenth of a millionth away
    ((scaled - millionths).abs() <= scaled.max(1.0) * 4.0 * f64::EPSILON)
        .then_some(millionths as i64)
}

/// An amount: a whole JSON number from 0 to 2^63 - 1 (`12.0` is whole).
fn whole_amount(amount: &Value) -> Option<i64> {
    let Value::Number(n) = amount else {
        return None;
    };
    if let Some(whole) = n.as_i64() {
        return (whole >= 0).then_some(whole);
    }
    let f = n.as_f64()?;
    // below 2^53 every whole f64 is exact
    (f >= 0.0 && f.fract() == 0.0 && f < 9_007_199_254_740_992.0).then_some(f as i64)
}

/// The name of a JSON value's type, for messages.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A value's JSON text, at most 80 characters, for messages.
fn short(value: &Value) -> String {
    value.to_string().chars().take(80).collect()
}

#[cfg(test)]
mod tests;
