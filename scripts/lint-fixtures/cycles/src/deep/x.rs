use super::y::Y;
pub struct X;
