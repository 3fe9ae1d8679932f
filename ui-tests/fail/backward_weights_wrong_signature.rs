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

    fn backward_weights(&self, _cx: &mut Cx, dy: &Tensor) -> Result<Tensor> {
        Ok(dy.clone())
    }
}

fn main() {
    // The API is still generated: no follow-on errors.
    let _ = GraphedBlock::options();
}
