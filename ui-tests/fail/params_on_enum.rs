use graphed::{Param, Parameters};

#[derive(Parameters)]
enum Net {
    A(Param),
}

fn main() {}
