use graphed::{graphed, Cx, Result, Tensor};

struct Block;

#[graphed(buckets(sizes = [128, 256]))]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

fn main() {}
