// A Vec stack is counted at construction, so a list of chunk numbers cannot be checked (or
// even read): the schedule is `windowed(...)` or given at run time.
use graphed::{graphed, Cx, Result, Tensor};

struct Block;

#[graphed]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

#[graphed(order = [1, 2, -2, -1])]
struct Model {
    embed: Block,
    blocks: Vec<Block>,
}

fn main() {}
