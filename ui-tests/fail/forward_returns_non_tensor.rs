use graphed::{graphed, Cx, Result, Tensor};

struct Block;

#[graphed(warmup = 3)]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<(Tensor, f32)> {
        Ok((x.clone(), 1.0))
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor, _dscale: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

fn main() {}
