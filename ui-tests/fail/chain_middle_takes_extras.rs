// Only the last chunk of a chained struct may take inputs besides the previous output (they
// are the whole model's extra inputs); a middle chunk, or a stack's layer, takes one tensor.
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

struct Masked;

#[graphed]
impl Masked {
    fn forward(&self, _cx: &mut Cx, x: &Tensor, _mask: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(dy.clone()), None))
    }
}

#[graphed(chained)]
struct Model {
    embed: Block,
    layers: Vec<Masked>,
    head: Block,
}

fn main() {}
