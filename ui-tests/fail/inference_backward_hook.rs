// Backward hooks and a weight-grad half on an impl without `backward` would never run.
use graphed::{capture_time_hook, graphed, Cx, Result, Tensor};

struct Block;

#[graphed(warmup = 3)]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward_weights(&mut self, _cx: &mut Cx) -> Result<()> {
        Ok(())
    }

    #[capture_time_hook(pre_backward)]
    fn unshard(&mut self) {}

    #[capture_time_hook(backward)]
    fn reshard(&mut self) {}
}

fn main() {}
