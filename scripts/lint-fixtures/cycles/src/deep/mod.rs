// Two rooms of one folder that import each other: the circle the lint must find below the top level.
pub mod x;
pub mod y;
