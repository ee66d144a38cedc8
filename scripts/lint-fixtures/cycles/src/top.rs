// A top-level module that imports a nested one: not a circle.
use crate::deep::x::X;
