// Chunk 1's backward needs the grad chunk 2's backward computes: `-1` before `-2` breaks the
// data flow, whatever the counts say.
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

#[graphed(order = [1, -1, 2, -2])]
struct TwoStage {
    first: Block,
    second: Block,
}

fn main() {}
