//! HTTP response fields for a decision, following the IETF "RateLimit header fields for HTTP" draft
//! (draft-ietf-httpapi-ratelimit-headers, the `RateLimit` / `RateLimit-Policy` pair) and RFC 9110's
//! `Retry-After` (delay in whole seconds).
//!
//! - `RateLimit: "<policy>";r=<remaining>;t=<seconds until full>`
//! - `RateLimit-Policy: "<policy>";q=<quota>;w=<window seconds>`: for a window algorithm the quota is the
//!   rate per window; for a token bucket it is the burst, and the window the time the bucket takes to refill
//!   from empty (`burst × per / rate`).
//! - `Retry-After: <seconds>` only when denied and the cost can ever be granted.
//! - A concurrency policy: `RateLimit-Policy: "<policy>";q=<leases>;qu="concurrent-requests"` (the draft's
//!   quota unit for requests in flight), `r` the leases still free, `t` until the last held one expires.
//!
//! Seconds are rounded up, so a client that waits as told is never early.

use serde_json::{Map, Value};

use crate::algorithm::{Algorithm, Policy};

/// What the fields are computed from.
pub struct Input<'a> {
    /// The policy's name (`"default"` is printed when unknown).
    pub name: Option<&'a str>,
    /// Whether the call was granted.
    pub allowed: bool,
    /// Whole tokens left.
    pub remaining: i64,
    /// The capacity reported by the decision.
    pub limit: Option<i64>,
    /// Microseconds until the call could be granted.
    pub retry_after_us: Option<i128>,
    /// Microseconds until full.
    pub reset_after_us: i128,
    /// The policy's numbers, when known.
    pub policy: Option<Policy>,
}

fn ceil_seconds(us: i128) -> i128 {
    (us.max(0) + 999_999) / 1_000_000
}

/// The window `w` of `RateLimit-Policy`, in seconds.
pub fn window_seconds(p: &Policy) -> i128 {
    match p.algorithm() {
        Algorithm::TokenBucket => {
            let refill_us =
                (i128::from(p.burst()) * i128::from(p.period_us()) + i128::from(p.rate()) - 1)
                    / i128::from(p.rate());
            ceil_seconds(refill_us).max(1)
        }
        Algorithm::FixedWindow
        | Algorithm::SlidingWindow
        | Algorithm::CalendarWindow
        | Algorithm::Concurrency
        | Algorithm::Block
        | Algorithm::Reservation
        | Algorithm::AdaptiveLimit => ceil_seconds(i128::from(p.period_us())).max(1),
    }
}

/// The fields as a JSON object of header name → value.
pub fn fields(input: &Input<'_>) -> Value {
    let name = input.name.unwrap_or("default");
    let mut map = Map::new();
    map.insert(
        "RateLimit".into(),
        Value::String(format!(
            "\"{name}\";r={};t={}",
            input.remaining.max(0),
            ceil_seconds(input.reset_after_us)
        )),
    );
    if let Some(p) = &input.policy {
        let quota = input.limit.unwrap_or(p.burst());
        // a concurrency policy's quota is leases held at once: the draft's concurrent-requests unit, which
        // has no window
        let value = if p.algorithm() == Algorithm::Concurrency {
            format!("\"{name}\";q={quota};qu=\"concurrent-requests\"")
        } else {
            format!("\"{name}\";q={quota};w={}", window_seconds(p))
        };
        map.insert("RateLimit-Policy".into(), Value::String(value));
    }
    if !input.allowed {
        if let Some(r) = input.retry_after_us {
            map.insert(
                "Retry-After".into(),
                Value::String(ceil_seconds(r).max(1).to_string()),
            );
        }
    }
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn denied_token_bucket() {
        let p = Policy::new(Algorithm::TokenBucket, 10, 60 * S, 20).unwrap();
        let v = fields(&Input {
            name: Some("api"),
            allowed: false,
            remaining: 0,
            limit: Some(20),
            retry_after_us: Some(5_000_001),
            reset_after_us: 120_000_000,
            policy: Some(p),
        });
        assert_eq!(
            v,
            serde_json::json!({
                "RateLimit": "\"api\";r=0;t=120",
                "RateLimit-Policy": "\"api\";q=20;w=120",
                "Retry-After": "6",
            })
        );
    }

    #[test]
    fn allowed_window_without_retry() {
        let p = Policy::new(Algorithm::FixedWindow, 100, 3600 * S, 100).unwrap();
        let v = fields(&Input {
            name: Some("hourly"),
            allowed: true,
            remaining: 42,
            limit: Some(100),
            retry_after_us: None,
            reset_after_us: 1,
            policy: Some(p),
        });
        assert_eq!(
            v,
            serde_json::json!({
                "RateLimit": "\"hourly\";r=42;t=1",
                "RateLimit-Policy": "\"hourly\";q=100;w=3600",
            })
        );
    }

    #[test]
    fn unknown_policy_prints_default_and_no_policy_field() {
        let v = fields(&Input {
            name: None,
            allowed: false,
            remaining: 3,
            limit: Some(10),
            retry_after_us: None,
            reset_after_us: 0,
            policy: None,
        });
        assert_eq!(v, serde_json::json!({ "RateLimit": "\"default\";r=3;t=0" }));
    }
}
