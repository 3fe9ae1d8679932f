use graphed::{graphed, Cx, Result, Tensor};

struct Block;

#[graphed(warmup = 3)]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        Ok((x.clone(), None))
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor, dz: &Tensor) -> Result<Option<Tensor>> {
        let _ = dz;
        Ok(Some(dy.clone()))
    }
}

fn main() {}
