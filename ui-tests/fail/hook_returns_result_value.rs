use graphed::{capture_time_hook, graphed, Cx, Result, Tensor};

struct Block;

#[graphed()]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }

    #[capture_time_hook(backward)]
    fn reshard(&mut self) -> Result<usize> {
        Ok(0)
    }
}

fn main() {}
