// `crate = "..."` points generated code at the runtime under another name.
extern crate graphed as renamed;

use renamed::{Cx, Result, Tensor};

struct Block;

#[renamed::graphed(crate = "renamed", warmup = 1)]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }

    #[renamed::capture_time_hook(forward)]
    fn hook(&mut self) {}
}

#[renamed::graphed(crate = "renamed", order = [1, -1])]
struct One {
    only: Block,
}

fn main() {
    let _ = One { only: Block };
}
