use graphed::{graphed, Cx, Result, Tensor};

struct Block;

#[graphed(warmup = 3)]
impl Block {
    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

fn main() {}
