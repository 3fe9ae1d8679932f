// A checkpointed chunk recomputes its forward inside its backward, so it runs its weight grads
// there too: `w(c)` entries for it have nothing to run.
use graphed::{graphed, Cx, Result, Tensor};

struct Split;

#[graphed]
impl Split {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }

    fn backward_weights(&mut self, _cx: &mut Cx) -> Result<()> {
        Ok(())
    }
}

#[graphed(order = [1, 2, 3, -3, -2, -1, w(3), w(2)])]
struct Model {
    first: Split,
    #[graphed(checkpoint_every = 2)]
    blocks: [Split; 2],
}

fn main() {}
