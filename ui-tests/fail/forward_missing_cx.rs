use graphed::{graphed, Result, Tensor};

struct Block;

#[graphed(warmup = 3)]
impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut graphed::Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

fn main() {}
