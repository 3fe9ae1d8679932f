// An inference module's wrapper has no `backward` to call.
use graphed::{graphed, Cx, Device, Result, Tensor};

struct Block;

#[graphed(warmup = 3)]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
}

fn main() -> Result<()> {
    let x = Tensor::zeros(&Device::host(), &[2])?;
    let mut graphed = Block.make_graphed(&x)?;
    let y = graphed.forward(&x)?;
    graphed.backward(&y)?;
    Ok(())
}
