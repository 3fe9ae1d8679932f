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

#[graphed(buckets(axis = 1, sizes = [64, 128], sizes = powers_of_two(min = 8, max = 128)))]
struct Model {
    first: Block,
    second: Block,
}

fn main() {}
