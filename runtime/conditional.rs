//! Conditional graphs: a captured graph run as the body of a WHILE or IF node whose condition
//! the device evaluates, so one launch runs the body as many times as the device decides
//! (CUDA 12.4 conditional nodes; the host backend runs the same loop on the CPU). And work
//! captured straight into an IF node inside a running capture ([`Condition::run_if`]), as
//! the mixed-precision optimizers skip their update after an overflow.

use crate::backend::{CondKind, CondTest, HostPtr, Ptr, Recorded, ScaleUpdate};
use crate::error::GraphError;
use crate::{Capabilities, CaptureError, CudaVersion, DType, Device, Error, Graph, Result, Tensor};

/// What a conditional graph tests on the device, before each pass of its body: the value of a
/// one-element `f32` or [`DType::I32`] tensor, nonzero or below a limit. The body (or the
/// work before the launch) writes the tensor; nothing is read on the host.
///
/// ```
/// use graphed::{Condition, DType, Device, Tensor};
/// let dev = Device::host();
/// let step = Tensor::from_i32(&dev, &[0], &[1])?;
/// let cond = Condition::below(&step, 16.0)?; // while step < 16
/// let flag = Tensor::zeros(&dev, &[1])?;
/// let cond = Condition::nonzero(&flag)?; // if flag != 0
/// assert!(Condition::nonzero(&Tensor::zeros(&dev, &[2])?).is_err()); // one element only
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Condition {
    value: Tensor,
    /// The element tested (0 for the public constructors).
    index: usize,
    below: Option<f32>,
}

impl Condition {
    /// Holds while `flag[0] != 0`. `flag` is a one-element f32 or i32 tensor.
    pub fn nonzero(flag: &Tensor) -> Result<Condition> {
        Condition::new("Condition::nonzero", flag, None)
    }

    /// Holds while `value[0] < limit` (compared in f64, so every i32 is exact). `value` is a
    /// one-element f32 or i32 tensor.
    pub fn below(value: &Tensor, limit: f32) -> Result<Condition> {
        Condition::new("Condition::below", value, Some(limit))
    }

    fn new(op: &'static str, value: &Tensor, below: Option<f32>) -> Result<Condition> {
        if value.numel() != 1 {
            return Err(Error::shape(op, crate::ShapeProblem::layout("the condition", "one value", value.dims())));
        }
        Condition::element(op, value, 0, below)
    }

    /// A condition on element `index` of `value` (the loss scaler's overflow flag is element
    /// 1 of its state): `value[index] < limit` with `below`, else `value[index] != 0`.
    pub(crate) fn element(op: &'static str, value: &Tensor, index: usize, below: Option<f32>) -> Result<Condition> {
        if value.dtype() != DType::F32 && value.dtype() != DType::I32 {
            return Err(Error::DType { op, got: value.dtype(), expected: DType::I32 });
        }
        if index >= value.numel() {
            return Err(Error::shape(op, crate::ShapeProblem::Index { index, got: value.dims().to_vec() }));
        }
        value.check_fresh()?;
        if !value.device().is_capturing() {
            // The kernel that sets conditions, loaded here rather than in a capture that uses
            // the condition (no-op once loaded, on the host, and on drivers without conditional
            // nodes). Best effort: a failure shows, typed, where the condition is used.
            let _ = warm(value.device());
        }
        Ok(Condition { value: value.clone(), index, below })
    }

    /// The tensor the condition reads.
    pub fn value(&self) -> &Tensor {
        &self.value
    }

    fn test(&self) -> Result<CondTest> {
        // Both dtypes are 4 bytes an element.
        let offset = 4 * self.index;
        let (ptr, host) = match self.value.ptr()? {
            Ptr::Cuda(p) => (p + offset as u64, None),
            Ptr::Host(h) => (0, Some(HostPtr { offset: h.offset + offset, len: 1, ..h })),
        };
        Ok(CondTest { ptr, host, is_i32: self.value.dtype() == DType::I32, below: self.below })
    }

    /// Runs `then` so that, inside a capture, its device work happens only where this
    /// condition holds: on CUDA it is captured into the body of an IF node whose condition a
    /// kernel sets on the device at every replay (one launch of a graph that skips the work
    /// launches none of its kernels); on the host backend into one recorded op that tests the
    /// value and runs the body's ops if it holds. Outside a capture `then` just runs, on both
    /// backends: nothing on the device can skip a launch there. So `then`'s work must itself
    /// leave everything as it was when the condition does not hold (its kernels read the
    /// condition, as the optimizers' do the loss scaler's flag): the IF node saves the
    /// launches, it does not change what the work does. It must not change the condition's
    /// value either.
    ///
    /// Refused inside a capture on CUDA when the driver predates conditional nodes
    /// ([`Error::ConditionalUnsupported`]); a body that holds what a conditional body may not
    /// (allocation or host nodes, collectives) is [`Error::ConditionalBody`], and ending the
    /// capture from inside `then` is [`Error::IllegalInConditionalBody`]. When `then` fails
    /// or panics, the stream still captures the outer graph and the error (or panic) is
    /// passed on; on CUDA that capture then ends discarded ([`Error::CaptureInvalidated`]: a
    /// conditional node cannot be taken back out of a graph), on the host it ends as usual.
    /// On CUDA a small kernel sets the condition; making a condition outside a
    /// capture loads it (the first time on a device), so no capture has to.
    ///
    /// ```
    /// use graphed::{ops, CaptureMode, Condition, Device, Graph, Tensor};
    /// let dev = Device::host();
    /// let (flag, x, one) = (Tensor::zeros(&dev, &[1])?, Tensor::zeros(&dev, &[1])?, Tensor::full(&dev, &[1], 1.0)?);
    /// let when = Condition::nonzero(&flag)?;
    /// let mut g = Graph::new(&dev);
    /// g.capture(CaptureMode::Global, || {
    ///     when.run_if(|| ops::axpy_(&x, 1.0, &one))?; // x += 1, only while flag != 0
    ///     ops::axpy_(&x, 10.0, &one) // always
    /// })?;
    /// g.replay()?;
    /// assert_eq!(x.to_vec()?, vec![10.0]); // the body was skipped
    /// flag.copy_from_slice(&[1.0])?;
    /// g.replay()?;
    /// assert_eq!(x.to_vec()?, vec![21.0]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn run_if<R>(&self, then: impl FnOnce() -> Result<R>) -> Result<R> {
        self.run_if_after(None, then)
    }

    /// Runs `body` as long as this condition holds, tested before each pass. Inside a capture
    /// the loop is a WHILE node of the graph being captured: on CUDA (12.4 drivers) a small
    /// kernel sets the node's condition before it and again at the end of each pass, so the
    /// whole loop runs on the device within the graph's one launch (what
    /// [`Graph::while_loop`] does for a graph of its own, here in the middle of any capture,
    /// after and before other work); on the host backend one recorded op tests the value and
    /// runs the body's ops. Outside a capture the loop runs on the host, reading the value
    /// before each pass (one wait for the device a pass). `body` must eventually make the
    /// condition false, or the loop never ends.
    ///
    /// The body's restrictions are those of [`Condition::run_if`]'s: no allocation or host
    /// nodes, no collectives ([`Error::ConditionalBody`]); a driver before CUDA 12.4 is
    /// [`Error::ConditionalUnsupported`] inside a capture.
    ///
    /// ```
    /// use graphed::{ops, CaptureMode, Condition, Device, Graph, Tensor};
    /// let dev = Device::host();
    /// let (counter, one) = (Tensor::zeros(&dev, &[1])?, Tensor::full(&dev, &[1], 1.0)?);
    /// let below_5 = Condition::below(&counter, 5.0)?;
    /// let mut g = Graph::new(&dev);
    /// g.capture(CaptureMode::Global, || {
    ///     ops::fill_(&counter, 0.0)?; // work before the loop, in the same graph
    ///     below_5.run_while(|| ops::axpy_(&counter, 1.0, &one))
    /// })?;
    /// counter.copy_from_slice(&[40.0])?;
    /// g.replay()?; // one launch: the fill, then five passes
    /// assert_eq!(counter.to_vec()?, vec![5.0]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn run_while(&self, mut body: impl FnMut() -> Result<()>) -> Result<()> {
        let device = self.value.device();
        let backend = device.backend();
        if !backend.is_capturing() {
            warm(device)?;
            while self.holds()? {
                body()?;
            }
            return Ok(());
        }
        check_driver(device)?;
        backend.capture_while(&self.test()?, &mut body)
    }

    /// The test on the value as it is now (read to the host; waits for the device).
    fn holds(&self) -> Result<bool> {
        let v = if self.value.dtype() == DType::I32 {
            self.value.to_i32_vec()?.get(self.index).map(|&x| f64::from(x))
        } else {
            self.value.to_vec()?.get(self.index).map(|&x| f64::from(x))
        };
        let v = v.ok_or_else(|| Error::msg("a condition's element past its value's end"))?;
        Ok(match self.below {
            Some(limit) => v < f64::from(limit),
            None => v != 0.0,
        })
    }

    /// [`Condition::run_if`], `before` run right before the test (see [`Before`]).
    pub(crate) fn run_if_after<R>(&self, before: Option<&Before>, then: impl FnOnce() -> Result<R>) -> Result<R> {
        let mut then = Some(then);
        let mut out = None;
        self.run_branches(
            before,
            &mut || {
                if let Some(f) = then.take() {
                    out = Some(f()?);
                }
                Ok(())
            },
            None,
        )?;
        Ok(out.ok_or(GraphError::BranchNotRun { op: "Condition::run_if" })?)
    }

    /// [`Condition::run_if`] with an else branch: inside a capture `then`'s work happens where
    /// the condition holds and `otherwise`'s where it does not, the condition evaluated once,
    /// on the device, before either. On CUDA that is one IF node with an else body where the
    /// driver has them (CUDA 12.8), else two IF nodes (one a branch) whose conditions one
    /// kernel sets; setting `GRAPHED_IF_ELSE_NODE=0` asks for the two nodes on any driver
    /// (to test that form). Outside a capture both run, in order, and each must do nothing
    /// where its branch is not taken.
    ///
    /// ```
    /// use graphed::{ops, CaptureMode, Condition, Device, Graph, Tensor};
    /// let dev = Device::host();
    /// let (flag, x, one) = (Tensor::zeros(&dev, &[1])?, Tensor::zeros(&dev, &[1])?, Tensor::full(&dev, &[1], 1.0)?);
    /// let when = Condition::nonzero(&flag)?;
    /// let mut g = Graph::new(&dev);
    /// g.capture(CaptureMode::Global, || {
    ///     when.run_if_else(|| ops::axpy_(&x, 1.0, &one), || ops::axpy_(&x, -1.0, &one)).map(drop)
    /// })?;
    /// g.replay()?;
    /// flag.copy_from_slice(&[1.0])?;
    /// g.replay()?;
    /// g.replay()?;
    /// assert_eq!(x.to_vec()?, vec![1.0]); // -1, then +1 twice
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn run_if_else<A, B>(
        &self,
        then: impl FnOnce() -> Result<A>,
        otherwise: impl FnOnce() -> Result<B>,
    ) -> Result<(A, B)> {
        self.run_if_else_after(None, then, otherwise)
    }

    /// [`Condition::run_if_else`], `before` run right before the test (see [`Before`]).
    pub(crate) fn run_if_else_after<A, B>(
        &self,
        before: Option<&Before>,
        then: impl FnOnce() -> Result<A>,
        otherwise: impl FnOnce() -> Result<B>,
    ) -> Result<(A, B)> {
        let (mut then, mut otherwise) = (Some(then), Some(otherwise));
        let (mut a, mut b) = (None, None);
        self.run_branches(
            before,
            &mut || {
                if let Some(f) = then.take() {
                    a = Some(f()?);
                }
                Ok(())
            },
            Some(&mut || {
                if let Some(f) = otherwise.take() {
                    b = Some(f()?);
                }
                Ok(())
            }),
        )?;
        Ok(a.zip(b).ok_or(GraphError::BranchNotRun { op: "Condition::run_if_else" })?)
    }

    /// Checks, then runs `before` and each branch eagerly, or captures them into conditional
    /// nodes (`before` inside the kernel that sets the conditions on CUDA).
    fn run_branches<'a>(
        &self,
        before: Option<&Before>,
        then: &'a mut dyn FnMut() -> Result<()>,
        otherwise: Option<&'a mut dyn FnMut() -> Result<()>>,
    ) -> Result<()> {
        let device = self.value.device();
        let test = self.test()?;
        let backend = device.backend();
        if !backend.is_capturing() {
            warm(device)?;
            before.map_or(Ok(()), |b| (b.ops)())?;
            return std::iter::once(then).chain(otherwise).try_for_each(|b| b());
        }
        check_driver(device)?;
        let update = match before {
            Some(b) if backend.cuda().is_some() => Some(b.update),
            Some(b) => (b.ops)().map(|()| None)?,
            None => None,
        };
        backend.capture_conditional(&test, update, then, otherwise)
    }
}

/// Work that runs right before a conditional's test and changes nothing the test or the
/// branches read but the test's value, which it reads: the loss scaler's update, which ends a
/// mixed-precision step. Inside a capture on CUDA the kernel that sets the conditions does it
/// first (one launch for both); elsewhere `ops` launch it (eagerly, or recorded on the host
/// backend) before the test.
pub(crate) struct Before<'a> {
    /// The work as ops.
    pub(crate) ops: &'a dyn Fn() -> Result<()>,
    /// The same work done by the condition kernel.
    pub(crate) update: ScaleUpdate,
}

/// Whether `device` can put captured work under a conditional node: the host backend always, a
/// CUDA device when its driver has conditional nodes (CUDA 12.4).
pub(crate) fn supported(device: &Device) -> bool {
    device.backend().cuda().is_none_or(|c| c.driver_version >= CudaVersion::CONDITIONAL_NODES)
}

/// Loads the kernels that set conditions on `device` (CUDA, when its driver has conditional
/// nodes), so that no capture has to: a no-op once they are loaded, and on the host.
pub(crate) fn warm(device: &Device) -> Result<()> {
    match device.backend().cuda() {
        Some(c) if supported(device) => c.conditional_kernels().map(drop),
        _ => Ok(()),
    }
}

/// A captured graph run as the body of a conditional node: [`Graph::while_loop`] runs it as
/// long as its [`Condition`] holds (tested before each pass), [`Graph::if_then`] once if it
/// holds, all in one launch ([`ConditionalGraph::launch`]) with the condition evaluated on the
/// device. It owns the body graph (and so the pool memory the body's captured work uses).
///
/// On CUDA it is a graph with a CUDA 12.4 conditional node (a driver for an older CUDA is
/// [`Error::ConditionalUnsupported`]): a kernel before the node and, for a loop, one after
/// each pass of the body set the condition with `cudaGraphSetConditional`. The body must hold
/// kernels, copies and memsets only: a body with memory allocation or free nodes, host nodes,
/// or collectives (NCCL, or the host backend's emulated ones) is refused when the conditional
/// graph is built ([`Error::ConditionalBody`]). On the host backend one op tests the value and
/// runs the body's recorded ops as long (or if) it holds.
///
/// A loop whose body never makes its condition false never ends, on either backend.
///
/// ```
/// use graphed::{ops, CaptureMode, Condition, Device, Graph, Tensor};
/// let dev = Device::host();
/// let counter = Tensor::zeros(&dev, &[1])?;
/// let one = Tensor::full(&dev, &[1], 1.0)?;
/// let mut body = Graph::new(&dev);
/// body.capture(CaptureMode::Global, || ops::axpy_(&counter, 1.0, &one))?;
/// let mut lp = body.while_loop(&Condition::below(&counter, 5.0)?)?;
/// lp.launch()?; // one launch: the body runs while counter < 5
/// assert_eq!(counter.to_vec()?, vec![5.0]);
/// counter.copy_from_slice(&[3.0])?;
/// lp.launch()?;
/// assert_eq!(counter.to_vec()?, vec![5.0]); // twice more
/// # Ok::<(), graphed::Error>(())
/// ```
pub struct ConditionalGraph {
    body: Graph,
    condition: Condition,
    kind: CondKind,
    recorded: Recorded,
}

impl std::fmt::Debug for ConditionalGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConditionalGraph({:?} over {:?})", self.kind, self.body)
    }
}

impl ConditionalGraph {
    /// Checks everything, then builds: the body is captured, not capturing, on the
    /// condition's device, and holds only what conditional bodies may; on CUDA the driver
    /// supports CUDA 12.4. A refused call gives nothing back but the error (the body is
    /// dropped with it; use [`ConditionalGraph::check_body`] first to keep it).
    /// Checks, then builds; a refusal or a failure hands the body back unchanged.
    fn build(
        body: Graph,
        condition: &Condition,
        kind: CondKind,
    ) -> std::result::Result<ConditionalGraph, CaptureError<Box<Graph>>> {
        let built = ConditionalGraph::check_body(&body, condition).and_then(|()| {
            let device = body.device().clone();
            body.recorded()
                .ok_or_else(|| Error::NotCaptured { graph: body.label().to_string() })
                .and_then(|r| Recorded::conditional(device.backend(), kind, condition.test()?, r))
        });
        match built {
            Ok(recorded) => Ok(ConditionalGraph { body, condition: condition.clone(), kind, recorded }),
            Err(e) => Err(CaptureError::new(e, Box::new(body))),
        }
    }

    /// The checks [`Graph::while_loop`] and [`Graph::if_then`] make before they build, without
    /// taking the body: the same typed errors.
    pub fn check_body(body: &Graph, condition: &Condition) -> Result<()> {
        let device = body.device();
        device.backend().forbid_during_capture("building a conditional graph")?;
        let recorded = body.recorded().ok_or_else(|| Error::NotCaptured { graph: body.label().to_string() })?;
        if condition.value.device() != device {
            return Err(Error::DeviceMismatch {
                op: "conditional graph",
                a: device.name(),
                b: condition.value.device().name(),
            });
        }
        check_driver(device)?;
        if let Some(node) = recorded.conditional_body_violation(device.backend())? {
            return Err(Error::ConditionalBody { graph: body.label().to_string(), node });
        }
        Ok(())
    }

    /// Runs the conditional graph once on the device stream: the condition is tested on the
    /// device and the body runs as many times as it holds (a loop) or at most once. The body's
    /// pool order is checked and advanced as for a replay of the body (so it is refused while
    /// another graph of a shared pool is due); refused during a capture.
    pub fn launch(&mut self) -> Result<()> {
        let ticket = self.body.check_replay()?;
        self.condition.value.check_fresh()?;
        let device = self.body.device().clone();
        self.recorded.launch(device.backend())?;
        self.body.pool().advance_replay(ticket);
        Ok(())
    }

    /// The body graph.
    pub fn body(&self) -> &Graph {
        &self.body
    }

    /// The condition.
    pub fn condition(&self) -> &Condition {
        &self.condition
    }

    /// Whether this is a loop (`while_loop`) rather than a branch (`if_then`).
    pub fn is_loop(&self) -> bool {
        self.kind == CondKind::While
    }

    /// Gives the body graph back (the conditional graph is destroyed).
    pub fn into_body(self) -> Graph {
        self.body
    }
}

/// Refuses a CUDA device whose driver predates conditional nodes (the host backend runs them
/// itself).
fn check_driver(device: &Device) -> Result<()> {
    driver_refusal(device.capabilities())
}

fn driver_refusal(caps: Capabilities) -> Result<()> {
    match caps.driver {
        Some(driver) if !caps.conditional_nodes => {
            Err(Error::ConditionalUnsupported { driver, needed: CudaVersion::CONDITIONAL_NODES })
        }
        _ => Ok(()),
    }
}

impl Graph {
    /// This captured graph as the body of a loop that runs while `condition` holds, tested on
    /// the device before each pass; see [`ConditionalGraph`]. A refusal (the checks of
    /// [`ConditionalGraph::check_body`]) hands the body back (boxed) inside the error.
    pub fn while_loop(self, condition: &Condition) -> std::result::Result<ConditionalGraph, CaptureError<Box<Graph>>> {
        ConditionalGraph::build(self, condition, CondKind::While)
    }

    /// This captured graph as the body of a branch that runs once if `condition` holds
    /// (tested on the device); see [`ConditionalGraph`]. A refusal hands the body back (boxed)
    /// inside the error.
    ///
    /// ```
    /// use graphed::{ops, CaptureMode, Condition, Device, Graph, Tensor};
    /// let dev = Device::host();
    /// let (flag, x) = (Tensor::zeros(&dev, &[1])?, Tensor::zeros(&dev, &[1])?);
    /// let one = Tensor::full(&dev, &[1], 1.0)?;
    /// let mut body = Graph::new(&dev);
    /// body.capture(CaptureMode::Global, || ops::axpy_(&x, 1.0, &one))?;
    /// let mut skip = body.if_then(&Condition::nonzero(&flag)?)?;
    /// skip.launch()?;
    /// assert_eq!(x.to_vec()?, vec![0.0]); // flag is 0: skipped
    /// flag.copy_from_slice(&[1.0])?;
    /// skip.launch()?;
    /// assert_eq!(x.to_vec()?, vec![1.0]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn if_then(self, condition: &Condition) -> std::result::Result<ConditionalGraph, CaptureError<Box<Graph>>> {
        ConditionalGraph::build(self, condition, CondKind::If)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver older than CUDA 12.4 is refused with a typed error; 12.4, 13.0 and the host
    /// backend are not.
    #[test]
    fn drivers_before_cuda_12_4_are_refused() {
        let refused = driver_refusal(Capabilities::cuda(CudaVersion(12030), true, None));
        let Err(e @ Error::ConditionalUnsupported { driver, needed }) = &refused else { panic!("{refused:?}") };
        assert_eq!((*driver, *needed), (CudaVersion(12030), CudaVersion(12040)));
        assert!(e.to_string().contains("CUDA 12.4 or newer; this one supports CUDA 12.3"), "{e}");
        for v in [12040, 13000] {
            assert!(driver_refusal(Capabilities::cuda(CudaVersion(v), true, None)).is_ok());
        }
        assert!(driver_refusal(Capabilities::host()).is_ok());
    }
}
