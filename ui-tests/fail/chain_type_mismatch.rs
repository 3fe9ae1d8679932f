// In a chained struct each chunk's output is the next chunk's input: a chunk returning two
// tensors cannot feed the next one. The error is on the field.
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

struct TwoOut;

#[graphed]
impl TwoOut {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((x.clone(), x.clone()))
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor, _dz: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

#[graphed(chained)]
struct Model {
    split: TwoOut,
    block: Block,
}

fn main() {}
