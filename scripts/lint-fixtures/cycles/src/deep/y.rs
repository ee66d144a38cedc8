pub struct Y;
pub fn make() -> super::x::X {
    super::x::X
}
