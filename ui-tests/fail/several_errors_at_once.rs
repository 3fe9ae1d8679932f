// Every problem is reported in one build, and nothing else (the impl is still emitted).
use graphed::{capture_time_hook, graphed, Cx, Module, Result, Tensor};

struct Block;

#[graphed(warmup = 0, bogus = true)]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor, n: usize) -> Result<Tensor> {
        let _ = n;
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }

    #[capture_time_hook(pre_forwrd)]
    fn unshard(&self) {}
}

fn main() {
    // The stub `Module` impl keeps uses of the type free of follow-on errors.
    let _: Box<dyn Module> = Box::new(Block);
}
