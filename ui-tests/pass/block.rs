// A module with optional inputs and outputs and hooks of every kind; the generated names are
// usable with the types the user wrote.
use graphed::{capture_time_hook, graphed, Cx, Device, Module, Result, Tensor};

struct Block {
    calls: usize,
}

#[graphed(warmup = 3, allow_unused_input)]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor, mask: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
        Ok((x.clone(), mask.cloned()))
    }

    fn backward(
        &mut self,
        _cx: &mut Cx,
        dy: &Tensor,
        dmask: Option<&Tensor>,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(dy.clone()), dmask.cloned()))
    }

    #[capture_time_hook(pre_forward)]
    fn unshard(&mut self) -> Result<()> {
        self.calls += 1;
        Ok(())
    }

    #[capture_time_hook(forward)]
    fn after_forward(&mut self) {}

    #[capture_time_hook(pre_backward, prepend)]
    fn before_backward(&mut self) {}

    #[graphed::capture_time_hook(backward)]
    fn reshard(&mut self) {}
}

fn main() -> Result<()> {
    let dev = Device::host();
    let x = Tensor::zeros(&dev, &[2])?.with_requires_grad(true);
    let mut graphed: GraphedBlock = Block { calls: 0 }.make_graphed(&x, None)?;
    let (_y, _extra): (Tensor, Option<Tensor>) = graphed.forward(&x, None)?;
    let (_dx, _dmask): (Option<Tensor>, Option<Tensor>) = graphed.backward(&x, None)?;
    let _: &Block = graphed.module();
    let _: &mut Block = graphed.module_mut();
    let _: &graphed::GraphedModules = graphed.inner();
    let _: &mut graphed::GraphedModules = graphed.inner_mut();
    graphed.eval();
    graphed.train();
    let _: BlockInputs = BlockInputs { x: x.clone(), mask: None };
    let _: BlockOutputs = BlockOutputs { output_0: x.clone(), output_1: None };
    let _: BlockGradOutputs = BlockGradOutputs { dy: x.clone(), dmask: None };
    let _: BlockGradInputs = BlockGradInputs { x: None, mask: None };
    let _: Box<dyn Module> = Box::new(Block { calls: 0 });
    let _: graphed::GraphOptions = GraphedBlock::options();
    let _: graphed::GraphedModules = graphed.into_inner();
    Ok(())
}
