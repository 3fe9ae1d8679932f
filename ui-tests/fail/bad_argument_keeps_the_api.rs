// Only the attribute's arguments are wrong: the generated API is still emitted (with the
// defaults), so code using it reports no follow-on errors, only the one about the argument.
use graphed::{graphed, Cx, Device, Result, Tensor};

struct Block;

#[graphed(warmup = 0, colour = "red")]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

fn main() -> Result<()> {
    let dev = Device::host();
    let x = Tensor::zeros(&dev, &[1])?;
    let mut g: GraphedBlock = Block.make_graphed(&x)?;
    let _: BlockInputs = BlockInputs { x: x.clone() };
    let _y = g.forward(&x)?;
    Ok(())
}
