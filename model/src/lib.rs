//! rate_limit's model: the exact, integer arithmetic of every kind of limit and what a call decides, in
//! plain Rust that knows nothing of PostgreSQL (`cargo test -p rate_limit_model` runs its tests in seconds,
//! with no server). The extension's stores load, lock and save state; every number comes from here.
//!
//! - [`algorithm`]: the algorithms (token bucket, fixed, sliding and calendar windows) and the lease and
//!   block buckets, on one state shape, and [`algorithm::adaptive`], a concurrency limit that adapts to
//!   what releases report (its bucket beside a key's lease slots),
//!   carry-over when a policy's numbers change, refunds, charges after the fact with bounded debt; [`algorithm::token_bucket`] is the token
//!   bucket's exact arithmetic (integer fractions of a token, rebasing on a clock that went back), and the
//!   limit given as rate per second and window;
//! - [`bounds`]: the table of every resource a caller can make the server hold and its bound, and how long
//!   a policy's bucket can stay short of full;
//! - [`target`]: the buckets a call asks for (namespace, key, numbers, shadow mode), what it asks of them
//!   (take or charge), and whether the call is granted;
//! - [`pipeline`]: how one take combines short buckets remembered, overrides, blocks and the penalty box,
//!   shadow mode and all-or-nothing, over a narrow store trait (property tests with an in-memory store);
//! - [`decision`]: combining the outcomes of a call's buckets into one decision (shadow-mode denials
//!   included);
//! - [`hierarchy`]: how a parent's tokens are shared among its children by weight, work-conserving, with
//!   a stated fairness bound (the sharing half of hierarchical quotas; not yet used by the stores);
//! - [`http`]: the RateLimit, RateLimit-Policy and Retry-After field values;
//! - [`meters`]: a policy's weighted meters, what amounts of several quantities cost in tokens;
//! - [`summary`]: the Space-Saving summary of the keys denied most; [`denials`]: when a backend adds its
//!   denials to it;
//! - [`shares`]: how much of the memory store one role and one database may fill, and what a partition frees when full;
//! - [`skew`]: how far a standby's clock is off its primary's, and the table store's clock shift after a
//!   promotion.

#![forbid(unsafe_code)]

pub mod algorithm;
pub mod bounds;
pub mod decision;
pub mod denials;
pub mod hierarchy;
pub mod http;
pub mod meters;
pub mod pipeline;
pub mod shares;
pub mod skew;
pub mod summary;
pub mod target;
#[cfg(test)]
mod test_support;
