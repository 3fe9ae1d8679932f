// An impl with a `forward` and no `backward`: an inference module. Its wrapper replays the
// forward graph; the forward-only capture leaves grads alone even where a weight needs one.
use graphed::{capture_time_hook, graphed, ops, Cx, Device, Module, Param, Result, Tensor, TypedModule};

struct Block {
    w: Param,
    captures: usize,
}

#[graphed(warmup = 3)]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, &self.w.value, None)
    }

    #[capture_time_hook(forward)]
    fn count(&mut self) {
        self.captures += 1;
    }
}

fn main() -> Result<()> {
    let dev = Device::host();
    let x = Tensor::zeros(&dev, &[2, 4])?;
    let block = Block { w: Param::new(Tensor::full(&dev, &[4, 4], 0.5)?)?, captures: 0 };
    assert!(!Module::has_backward(&block));
    let mut graphed: GraphedBlock = block.make_graphed(&x)?;
    let _y: Tensor = graphed.forward(&x)?;
    let _: BlockOutputs = BlockOutputs { output_0: Tensor::zeros(&dev, &[2, 4])? };
    // No grad surfaces: the typed module names `()` for them.
    let (): <Block as TypedModule>::GradOutputs = ();
    let (): <Block as TypedModule>::GradInputs = ();
    assert!(!graphed.inner().has_backward());
    assert_eq!(graphed.module().captures, 4); // three warm-up iterations and the capture
    Ok(())
}
