use graphed::capture_time_hook;

struct Block;

impl Block {
    #[capture_time_hook(pre_forward)]
    fn unshard(&mut self) {}
}

fn main() {
    Block.unshard();
}
