//! x
pub fn x(){}
