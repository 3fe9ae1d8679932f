// A fixed-size stack's layers are chunks, numbered after the fields before it: this struct has
// three chunks, so 4 is out of range.
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

#[graphed(order = [1, 2, 3, 4, -4, -3, -2, -1])]
struct Model {
    embed: Block,
    blocks: [Block; 2],
}

fn main() {}
