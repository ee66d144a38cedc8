//! Time, in one place: the clocks the stores measure on ([`clock`]), the shift a promoted standby keeps
//! so that the table store's clock does not jump with the new primary's wall clock ([`clock_shift`]), and
//! the calendar periods of `calendar_window` policies, resolved with PostgreSQL's time zones ([`calendar`]).
//! The arithmetic of time inside a limit is the model's (`rate_limit_model`); this module adapts the
//! server's clocks and zones to it.

pub mod calendar;
pub mod clock;
pub mod clock_shift;
