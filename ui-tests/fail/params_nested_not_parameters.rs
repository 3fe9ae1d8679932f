use graphed::{Param, Parameters};

struct Config {
    width: usize,
}

#[derive(Parameters)]
struct Net {
    w: Param,
    #[param(nested)]
    config: Config,
}

fn main() {}
