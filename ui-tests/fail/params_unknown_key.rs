use graphed::{Param, Parameters};

#[derive(Parameters)]
struct Net {
    #[param(frozen)]
    w: Param,
}

fn main() {}
