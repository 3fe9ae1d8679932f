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

#[graphed(order = [1, 2, w(2), -2, -1])]
struct TwoStage {
    first: Split,
    second: Split,
}

fn main() {}
