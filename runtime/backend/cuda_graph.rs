//! CUDA graphs: stream capture, instantiation, launch, and reading a graph's nodes. A
//! [`RawGraph`] owns its driver handles and destroys them when dropped.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::Arc;

use std::ffi::c_void;

use cudarc::driver::{result, sys, CudaContext, CudaFunction};

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use super::cuda::{check, driver_err, CudaBackend, LaunchDims};
use super::kernels::KArg;
use super::DropErrors;
use super::{
    CaptureMode, CondKind, CondTest, GraphNode, LoopFold, NodeKind, ScaleUpdate, StreamGate, CONDITIONAL_BODY,
};
use crate::capabilities::CudaVersion;
use crate::error::{BodyNode, GraphError, Invalidation};
use crate::{Error, Result};

/// The driver version that has `cuFuncGetName` (kernel names in [`CudaBackend::nodes`]).
const FUNC_GET_NAME: CudaVersion = CudaVersion(12030);

/// The driver version whose IF nodes take an else body (`size` 2 in the node's parameters).
const IF_ELSE_NODES: CudaVersion = CudaVersion(12080);

/// The variable that, set to `0`, makes an if/else two IF nodes on any driver (the form of
/// drivers before CUDA 12.8), so that a newer machine tests that form too.
pub(crate) const IF_ELSE_NODE_VAR: &str = "GRAPHED_IF_ELSE_NODE";

/// Whether a driver of `version` captures an if/else into one IF node with an else body, rather
/// than two IF nodes: CUDA 12.8 and later, unless [`IF_ELSE_NODE_VAR`] is `0`.
pub(crate) fn if_else_in_one_node(version: CudaVersion) -> bool {
    version >= IF_ELSE_NODES && std::env::var(IF_ELSE_NODE_VAR).map_or(true, |v| v != "0")
}

/// A captured CUDA graph and, once instantiated, its executable. Owns both handles.
pub(crate) struct RawGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
    drop_errors: Arc<DropErrors>,
}

impl std::fmt::Debug for RawGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawGraph({:?}, instantiated: {})", self.graph, self.is_instantiated())
    }
}

// SAFETY: the handles are plain driver handles owned by this value; they may be used and
// destroyed from any thread that binds the context (every method here does). Graph objects are
// not internally synchronised, so `RawGraph` is deliberately not `Sync`: `&mut` or a single owner
// serialises every use.
unsafe impl Send for RawGraph {}

impl RawGraph {
    pub(crate) fn is_instantiated(&self) -> bool {
        !self.exec.is_null()
    }

    /// Destroys the executable and the graph, reporting the first driver error.
    fn destroy(&mut self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_err("cuCtxSetCurrent"))?;
        let mut first = Ok(());
        // SAFETY: each handle was created by us, is destroyed once and nulled. An executable
        // still running is freed by the driver when it completes.
        unsafe {
            if !self.exec.is_null() {
                first = first.and(result::graph::exec_destroy(self.exec).map_err(driver_err("cuGraphExecDestroy")));
                self.exec = std::ptr::null_mut();
            }
            if !self.graph.is_null() {
                first = first.and(result::graph::destroy(self.graph).map_err(driver_err("cuGraphDestroy")));
                self.graph = std::ptr::null_mut();
            }
        }
        first
    }
}

impl Drop for RawGraph {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            self.drop_errors.report(e.context("destroying a CUDA graph"));
        }
    }
}

impl CudaBackend {
    pub(crate) fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        self.bind()?;
        self.stream.begin_capture(stream_mode(mode)).map_err(driver_err("cuStreamBeginCapture"))
    }

    /// Ends the capture; the graph, or the error that invalidated the capture.
    pub(crate) fn end_capture(&self) -> Result<RawGraph> {
        self.bind()?;
        // SAFETY: the stream is ours; a null graph means the capture was invalidated.
        let g = unsafe { result::stream::end_capture(self.stream.cu_stream()) }
            .map_err(driver_err("cuStreamEndCapture"))?;
        if g.is_null() {
            return Err(Error::CaptureInvalidated { cause: Invalidation::IllegalOperation });
        }
        Ok(RawGraph {
            graph: g,
            exec: std::ptr::null_mut(),
            ctx: self.ctx.clone(),
            drop_errors: self.drop_errors.clone(),
        })
    }

    pub(crate) fn instantiate(&self, g: &mut RawGraph) -> Result<()> {
        if !g.exec.is_null() {
            return Ok(());
        }
        let _entered = self.gate.enter()?;
        self.bind()?;
        self.injected(super::FaultPoint::GraphInstantiate, "cuGraphInstantiate")?;
        // SAFETY: `g.graph` is a valid graph we own.
        g.exec = unsafe { result::graph::instantiate(g.graph, sys::CUgraphInstantiate_flags(0)) }
            .map_err(driver_err("cuGraphInstantiate"))?;
        // SAFETY: the exec was just created on this context.
        unsafe { result::graph::upload(g.exec, self.stream.cu_stream()) }.map_err(driver_err("cuGraphUpload"))?;
        Ok(())
    }

    /// A new graph whose nodes are `parts` as child graphs, chained in order, instantiated.
    pub(crate) fn fuse_graphs(&self, parts: &[&RawGraph]) -> Result<RawGraph> {
        self.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: creates an empty graph we own from here on (the RawGraph below destroys it).
        unsafe { check("cuGraphCreate", sys::cuGraphCreate(&mut graph, 0))? };
        let mut fused = RawGraph {
            graph,
            exec: std::ptr::null_mut(),
            ctx: self.ctx.clone(),
            drop_errors: self.drop_errors.clone(),
        };
        let mut prev: Option<sys::CUgraphNode> = None;
        for part in parts {
            let mut node: sys::CUgraphNode = std::ptr::null_mut();
            let deps: Vec<sys::CUgraphNode> = prev.into_iter().collect();
            // SAFETY: `fused.graph` and `part.graph` are valid graphs; the child is cloned into
            // the parent, so `part` stays independent; `deps` outlives the call.
            unsafe {
                check(
                    "cuGraphAddChildGraphNode",
                    sys::cuGraphAddChildGraphNode(&mut node, fused.graph, deps.as_ptr(), deps.len(), part.graph),
                )?
            };
            prev = Some(node);
        }
        self.instantiate(&mut fused)?;
        Ok(fused)
    }

    /// A new graph, instantiated, that runs `body` as a conditional node: `[set condition] ->
    /// WHILE/IF { body [-> set condition, for WHILE] }`. The condition kernel
    /// (`kernels/conditional.cu`) reads `test` on the device before the node and, for WHILE,
    /// after each pass of the body; the body is cloned into the node's own body graph as a
    /// child graph, so `body` stays independent. The caller checked the driver (CUDA 12.4) and
    /// the body's nodes.
    pub(crate) fn conditional_graph(&self, kind: CondKind, test: &CondTest, body: &RawGraph) -> Result<RawGraph> {
        let func = self.conditional_kernels()?.one;
        let _entered = self.gate.enter()?;
        self.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: creates an empty graph we own from here on (the RawGraph below destroys it).
        unsafe { check("cuGraphCreate", sys::cuGraphCreate(&mut graph, 0))? };
        let mut out = RawGraph {
            graph,
            exec: std::ptr::null_mut(),
            ctx: self.ctx.clone(),
            drop_errors: self.drop_errors.clone(),
        };
        let mut handle: sys::CUgraphConditionalHandle = 0;
        // SAFETY: `out.graph` is valid and the context is current; the handle belongs to the
        // graph (no default value is assigned at launch: the kernel before the node sets it).
        unsafe {
            check(
                "cuGraphConditionalHandleCreate",
                sys::cuGraphConditionalHandleCreate(&mut handle, out.graph, self.ctx.cu_ctx(), 0, 0),
            )?
        };
        let set = add_set_conditional(out.graph, &[], &func, handle, test)?;
        let (_, bodies) = add_conditional_node(out.graph, &[set], handle, kind, 1, self.ctx.cu_ctx())?;
        let body_graph = bodies[0];
        let mut child: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: both graphs are valid; the body is cloned into the node's body graph.
        unsafe {
            check(
                "cuGraphAddChildGraphNode",
                sys::cuGraphAddChildGraphNode(&mut child, body_graph, std::ptr::null(), 0, body.graph),
            )?
        };
        if kind == CondKind::While {
            add_set_conditional(body_graph, &[child], &func, handle, test)?;
        }
        self.instantiate(&mut out)?;
        Ok(out)
    }

    /// Captures `then` and `otherwise` (if given) into IF nodes of the capture in progress on
    /// the stream (see `Backend::capture_conditional`): one kernel, captured like any other,
    /// sets the conditions from `test` (after the loss scaler's `update`, when given); then
    /// each branch is captured into its body. An if/else is one IF node with an else body
    /// where the driver has them (CUDA 12.8, [`if_else_in_one_node`]), else two IF nodes on
    /// opposite conditions, both set by the one kernel.
    ///
    /// A stream captures one graph at a time, so a body is captured by leaving the outer
    /// capture (its graph already holds the IF node), capturing the node's body graph on the
    /// same stream (`cuStreamBeginCaptureToGraph`), and then capturing the outer graph again
    /// from the node on: what the caller queues next depends on the node, as it would on a
    /// kernel. PyTorch's `begin_capture_to_if_node` captures the body on a second stream
    /// instead; one stream keeps every launch of this backend (kernels, cuBLAS, copies) on the
    /// stream it always uses. The caller checked the driver (CUDA 12.4, which has every call
    /// used here but the else body).
    pub(crate) fn capture_conditional<'a>(
        &self,
        mode: CaptureMode,
        test: &CondTest,
        update: Option<ScaleUpdate>,
        then: &'a mut dyn FnMut() -> Result<()>,
        otherwise: Option<&'a mut dyn FnMut() -> Result<()>>,
        gate: &StreamGate,
    ) -> Result<()> {
        let (kernels, stream, nested, graph) = self.conditional_capture(gate)?;
        let new_handle = || self.conditional_handle(graph);
        let one_node = otherwise.is_some() && if_else_in_one_node(self.driver_version);
        let then_handle = new_handle()?;
        let else_handle = if otherwise.is_some() && !one_node { Some(new_handle()?) } else { None };
        let test_args = [
            KArg::Ptr(test.ptr),
            KArg::U32(test.is_i32 as u32),
            KArg::U32(test.below.is_some() as u32),
            KArg::F32(test.below.unwrap_or(0.0)),
        ];
        let (func, mut args) = match (update, else_handle) {
            (None, None) => (&kernels.one, vec![KArg::U64(then_handle)]),
            (None, Some(e)) => (&kernels.two, vec![KArg::U64(then_handle), KArg::U64(e)]),
            (Some(u), e) => (
                &kernels.update,
                vec![
                    KArg::U64(then_handle),
                    KArg::U64(e.unwrap_or(then_handle)),
                    KArg::U32(e.is_some() as u32),
                    KArg::Ptr(u.state),
                    KArg::F32(u.growth),
                    KArg::F32(u.backoff),
                    KArg::U32(u.interval),
                ],
            ),
        };
        args.extend(test_args);
        let one_thread = LaunchDims { grid: (1, 1, 1), block: (1, 1, 1), shared: 0 };
        self.launch_function(func, one_thread, &args)?;
        // A failed body ends the capture discarded: its node stays (the handle cannot be freed,
        // and a handle without its node fails instantiation), so the capture ends with a typed
        // error.
        let (mut graph, mut deps) = capture_info(stream)?;
        if one_node {
            // One node, two bodies: the branches in order, each captured as a single node's.
            let (node, bodies) = add_conditional_node(graph, &deps, then_handle, CondKind::If, 2, self.ctx.cu_ctx())?;
            for (branch, body) in std::iter::once(then).chain(otherwise).zip(bodies) {
                let place = BodyPlace { stream, mode: stream_mode(mode), node, body, deps: deps.clone(), fold: None };
                self.capture_body(place, branch, gate, nested).inspect_err(|_| gate.fail_branch())?;
            }
            return Ok(());
        }
        for (branch, handle) in std::iter::once(then).chain(otherwise).zip([then_handle].into_iter().chain(else_handle))
        {
            let (node, bodies) = add_conditional_node(graph, &deps, handle, CondKind::If, 1, self.ctx.cu_ctx())?;
            let place = BodyPlace { stream, mode: stream_mode(mode), node, body: bodies[0], deps, fold: None };
            (graph, deps) = self.capture_body(place, branch, gate, nested).inspect_err(|_| gate.fail_branch())?;
        }
        Ok(())
    }

    /// Captures `body` into a WHILE node of the capture in progress on the stream (see
    /// `Backend::capture_while`): the condition kernel, captured like any other, sets the
    /// condition from `test`; the node's body is captured as [`Self::capture_conditional`]
    /// captures a branch, followed by the same kernel, which sets the condition again after
    /// each pass. The caller checked the driver (CUDA 12.4).
    ///
    /// Unless `GRAPHED_FOLD_CONDITION=0`, where the node tests an i32 flag for nonzero, a kernel
    /// of the body that writes that flag may set the condition itself
    /// ([`Self::launch_setting_loop`]); when that kernel is the body's last node, the
    /// condition kernel after the body is left out (one kernel less a pass).
    pub(crate) fn capture_while(
        &self,
        mode: CaptureMode,
        test: &CondTest,
        body: &mut dyn FnMut() -> Result<()>,
        gate: &StreamGate,
    ) -> Result<()> {
        let (kernels, stream, nested, graph) = self.conditional_capture(gate)?;
        let handle = self.conditional_handle(graph)?;
        let args = [
            KArg::U64(handle),
            KArg::Ptr(test.ptr),
            KArg::U32(test.is_i32 as u32),
            KArg::U32(test.below.is_some() as u32),
            KArg::F32(test.below.unwrap_or(0.0)),
        ];
        let one_thread = LaunchDims { grid: (1, 1, 1), block: (1, 1, 1), shared: 0 };
        self.launch_function(&kernels.one, one_thread, &args)?;
        let (graph, deps) = capture_info(stream)?;
        let (node, bodies) = add_conditional_node(graph, &deps, handle, CondKind::While, 1, self.ctx.cu_ctx())?;
        let foldable = fold_requested() && test.is_i32 && test.below.is_none();
        let fold = foldable.then_some(LoopFold { handle, flag: test.ptr, set_by: None });
        let place = BodyPlace { stream, mode: stream_mode(mode), node, body: bodies[0], deps, fold };
        let mut pass = || -> Result<()> {
            body()?;
            if let Some(set_by) = gate.loop_fold_node() {
                // Nothing after the kernel that set the condition: its value stands.
                let (_, last) = capture_info(stream)?;
                if last.len() == 1 && last[0] as usize == set_by {
                    return Ok(());
                }
            }
            self.launch_function(&kernels.one, one_thread, &args)
        };
        self.capture_body(place, &mut pass, gate, nested).inspect_err(|_| gate.fail_branch())?;
        Ok(())
    }

    /// Launches `f`, a kernel of the condition program that writes a WHILE node's flag and sets
    /// the node's condition from it (its first argument is `handle`, which this prepends), in
    /// the body this thread captures now, whose node `handle` is (what
    /// [`StreamGate::loop_fold`] gave for the flag; see [`Self::capture_while`]); records the
    /// kernel's node so that no condition kernel follows it if nothing else does.
    pub(crate) fn launch_setting_loop(
        &self,
        handle: u64,
        f: impl FnOnce(&super::cuda::CondKernels) -> CudaFunction,
        dims: LaunchDims,
        args: &[KArg],
    ) -> Result<()> {
        let func = f(&self.conditional_kernels()?);
        let args: Vec<KArg> = std::iter::once(KArg::U64(handle)).chain(args.iter().copied()).collect();
        self.launch_function(&func, dims, &args)?;
        let (_, last) = capture_info(self.stream.cu_stream())?;
        if let [node] = last[..] {
            self.gate.set_loop_fold(node as usize);
        }
        Ok(())
    }

    /// What capturing a conditional node starts from: the condition kernels (loaded), the
    /// stream, whether the capture is already inside a conditional body, and the graph the
    /// stream captures into.
    fn conditional_capture(
        &self,
        gate: &StreamGate,
    ) -> Result<(super::cuda::CondKernels, sys::CUstream, bool, sys::CUgraph)> {
        let kernels = self.conditional_kernels()?;
        self.bind()?;
        let stream = self.stream.cu_stream();
        let (graph, _) = capture_info(stream)?;
        Ok((kernels, stream, gate.in_body(), graph))
    }

    /// A new conditional handle of `graph` (the graph a stream captures into), without a
    /// default value: the condition kernel sets it at every launch, before the node reads it.
    fn conditional_handle(&self, graph: sys::CUgraph) -> Result<sys::CUgraphConditionalHandle> {
        let mut handle: sys::CUgraphConditionalHandle = 0;
        // SAFETY: `graph` is live while the stream captures into it; the handle belongs to it.
        unsafe {
            check(
                "cuGraphConditionalHandleCreate",
                sys::cuGraphConditionalHandleCreate(&mut handle, graph, self.ctx.cu_ctx(), 0, 0),
            )?
        };
        Ok(handle)
    }

    /// Captures what `branch` queues into `place.body`, then captures the outer graph again
    /// after the node, whatever the branch did; returns the outer graph's handle and the nodes
    /// what comes next depends on. A body that failed (an error or a panic, passed on once
    /// the stream captures the outer graph again) or that holds what a body may not is
    /// emptied: the node stays and runs nothing, so the capture goes on as if the branch had
    /// queued no work. An empty body gets an empty node.
    fn capture_body(
        &self,
        place: BodyPlace,
        branch: &mut dyn FnMut() -> Result<()>,
        gate: &StreamGate,
        nested: bool,
    ) -> Result<(sys::CUgraph, Vec<sys::CUgraphNode>)> {
        let BodyPlace { stream, mode, node, body, deps, fold } = place;
        // Leave the outer capture: its graph keeps every node captured so far, the IF node too.
        let outer = end_stream_capture(stream)?;
        // SAFETY: `body` is the IF node's body graph, owned by the node, which `outer` holds.
        let began = unsafe {
            check(
                "cuStreamBeginCaptureToGraph",
                sys::cuStreamBeginCaptureToGraph(stream, body, std::ptr::null(), std::ptr::null(), 0, mode),
            )
        };
        let ran = match &began {
            Ok(()) => match gate.enter_body(fold) {
                Ok(inside) => {
                    let ran = catch_unwind(AssertUnwindSafe(&mut *branch));
                    drop(inside);
                    ran
                }
                Err(e) => Ok(Err(e)),
            },
            Err(_) => Ok(Ok(())),
        };
        let ended = if began.is_ok() { end_stream_capture(stream).map(drop) } else { Ok(()) };
        let captured = matches!(ran, Ok(Ok(()))) && began.is_ok() && ended.is_ok();
        let violation = if captured { self.violation_in(body, 0) } else { Ok(None) };
        let keep = captured && matches!(violation, Ok(None));
        // The node stays: its handle belongs to the outer graph, and a handle without its node
        // fails the graph's instantiation (no call frees a handle). A failed or refused body is
        // emptied instead, so the node runs nothing; a body must hold a node, so an empty one
        // gets an empty node. Only if that fails is the node taken out (and the graph will not
        // instantiate: the capture's error says so).
        let emptied = match keep {
            true if self.node_count(body).is_ok_and(|n| n > 0) => Ok(()),
            true => add_empty_node(body),
            false => self.clear_graph(body).and_then(|()| add_empty_node(body)),
        };
        // SAFETY: `node` is a node of `outer`, which no capture uses now; destroyed once.
        let kept = emptied.is_ok() || unsafe { sys::cuGraphDestroyNode(node) } != sys::CUresult::CUDA_SUCCESS;
        let next = if kept { vec![node] } else { deps };
        let next_ptr = if next.is_empty() { std::ptr::null() } else { next.as_ptr() };
        // SAFETY: `outer` is a live graph (ours since the end above, or a body graph its node
        // owns when nested) and `next` its nodes; the dependency array outlives the call.
        let resumed = unsafe {
            check(
                "cuStreamBeginCaptureToGraph",
                sys::cuStreamBeginCaptureToGraph(stream, outer, next_ptr, std::ptr::null(), next.len(), mode),
            )
        };
        if let Err(e) = resumed {
            if !nested {
                // No capture will end with the outer graph any more: it is ours to destroy.
                // SAFETY: created by the driver for the capture, ours since it ended, destroyed once.
                let _ = unsafe { result::graph::destroy(outer) };
            }
            return Err(e.context("capturing again after a conditional body; the capture is lost"));
        }
        match ran {
            Err(panic) => resume_unwind(panic),
            Ok(result) => result?,
        }
        began?;
        ended?;
        if let Some(node) = violation? {
            return Err(Error::ConditionalBody { graph: CONDITIONAL_BODY.into(), node });
        }
        emptied?;
        Ok((outer, next))
    }

    /// Destroys every top-level node of `graph` (a body being emptied; the context is bound).
    fn clear_graph(&self, graph: sys::CUgraph) -> Result<()> {
        for n in self.graph_nodes(graph)? {
            // SAFETY: a node of `graph`, which no capture uses now; each destroyed once.
            unsafe { check("cuGraphDestroyNode", sys::cuGraphDestroyNode(n))? };
        }
        Ok(())
    }

    /// The top-level nodes of `graph` (the context is bound). An empty graph (a body whose
    /// first op failed, as when a capture's pool must grow and it runs again) is not asked to
    /// fill a buffer: the driver rejects a non-null buffer with a zero count.
    fn graph_nodes(&self, graph: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>> {
        let count = self.node_count(graph)?;
        let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
        if count > 0 {
            let mut got = count;
            // SAFETY: `nodes` holds `count` slots; the driver writes at most `got` of them.
            unsafe { check("cuGraphGetNodes", sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut got))? };
            nodes.truncate(got);
        }
        Ok(nodes)
    }

    /// How many nodes `graph` holds (the context is bound).
    fn node_count(&self, graph: sys::CUgraph) -> Result<usize> {
        let mut count = 0usize;
        // SAFETY: a sizing call on a live graph.
        unsafe { check("cuGraphGetNodes", sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count))? };
        Ok(count)
    }

    pub(crate) fn launch_graph(&self, g: &RawGraph) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.bind()?;
        self.injected(super::FaultPoint::GraphLaunch, "cuGraphLaunch")?;
        // SAFETY: the exec is valid (instantiated before any replay).
        unsafe { result::graph::launch(g.exec, self.stream.cu_stream()) }.map_err(driver_err("cuGraphLaunch"))
    }

    /// The graph's nodes with their kinds, kernel names and dependencies.
    pub(crate) fn nodes(&self, g: &RawGraph) -> Result<Vec<GraphNode>> {
        self.bind()?;
        self.nodes_of(g.graph).map(|(nodes, _)| nodes)
    }

    /// Why `g` cannot be the body of a conditional node, if it cannot: the first node (in its
    /// child graphs too) that [`GraphNode::conditional_body_violation`] refuses.
    pub(crate) fn conditional_body_violation(&self, g: &RawGraph) -> Result<Option<BodyNode>> {
        self.bind()?;
        self.violation_in(g.graph, 0)
    }

    fn violation_in(&self, graph: sys::CUgraph, depth: usize) -> Result<Option<BodyNode>> {
        let (nodes, handles) = self.nodes_of(graph)?;
        for (node, &handle) in nodes.iter().zip(&handles) {
            if let Some(why) = node.conditional_body_violation() {
                return Ok(Some(if depth == 0 { why } else { BodyNode::InChildGraph(Box::new(why)) }));
            }
            if node.kind == NodeKind::ChildGraph {
                let mut child: sys::CUgraph = std::ptr::null_mut();
                // SAFETY: `handle` is a child-graph node of `graph`; the child stays owned by it.
                unsafe {
                    check("cuGraphChildGraphNodeGetGraph", sys::cuGraphChildGraphNodeGetGraph(handle, &mut child))?
                };
                if let Some(why) = self.violation_in(child, depth + 1)? {
                    return Ok(Some(why));
                }
            }
        }
        Ok(None)
    }

    /// The nodes of `graph` (the context is bound) and their driver handles, in one order.
    fn nodes_of(&self, graph: sys::CUgraph) -> Result<(Vec<GraphNode>, Vec<sys::CUgraphNode>)> {
        let nodes = self.graph_nodes(graph)?;
        let count = nodes.len();
        let index: HashMap<usize, usize> = nodes.iter().enumerate().map(|(i, n)| (*n as usize, i)).collect();
        let mut out = Vec::with_capacity(count);
        for (i, &node) in nodes.iter().enumerate() {
            let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `node` belongs to `g.graph`.
            unsafe { check("cuGraphNodeGetType", sys::cuGraphNodeGetType(node, &mut ty))? };
            let (kind, kernel) = match ty {
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => {
                    // SAFETY: a kernel node's params; we only read the function handle.
                    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
                    let name = unsafe {
                        check("cuGraphKernelNodeGetParams", sys::cuGraphKernelNodeGetParams_v2(node, &mut p))?;
                        let mut cname: *const std::ffi::c_char = std::ptr::null();
                        // `cuFuncGetName` is CUDA 12.3's: an older driver lacks the symbol.
                        if self.driver_version >= FUNC_GET_NAME
                            && sys::cuFuncGetName(&mut cname, p.func) == sys::CUresult::CUDA_SUCCESS
                            && !cname.is_null()
                        {
                            CStr::from_ptr(cname).to_string_lossy().into_owned()
                        } else {
                            "?".into()
                        }
                    };
                    (NodeKind::Kernel, Some(name))
                }
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => (NodeKind::Memcpy, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => (NodeKind::Memset, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY => (NodeKind::Empty, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => (NodeKind::MemAlloc, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => (NodeKind::MemFree, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST => (NodeKind::Host, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH => (NodeKind::ChildGraph, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL => (NodeKind::Conditional, None),
                _ => (NodeKind::Other, None),
            };
            let deps = self.dependencies_of(node)?;
            let dependencies = deps.iter().filter_map(|d| index.get(&(*d as usize)).copied()).collect();
            out.push(GraphNode { index: i, kind, kernel, dependencies });
        }
        Ok((out, nodes))
    }

    /// The nodes `node` depends on. CUDA 12.3's second version of the call also returns each
    /// edge's data, which we do not read: an edge that carries data (the programmatic edges of
    /// `GRAPHED_PDL=1` launches) makes the first version refuse to answer
    /// (`CUDA_ERROR_LOSSY_QUERY`). Older drivers have only the first.
    fn dependencies_of(&self, node: sys::CUgraphNode) -> Result<Vec<sys::CUgraphNode>> {
        const NAME: &str = "cuGraphNodeGetDependencies";
        let with_edges = self.driver_version >= FUNC_GET_NAME;
        let mut n = 0usize;
        // SAFETY: sizing call, then a fill into buffers of that size (skipped when empty: the
        // driver rejects a non-null buffer with a zero count).
        unsafe {
            if with_edges {
                check(
                    NAME,
                    sys::cuGraphNodeGetDependencies_v2(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut n),
                )?
            } else {
                check(NAME, sys::cuGraphNodeGetDependencies(node, std::ptr::null_mut(), &mut n))?
            }
        };
        let mut deps = vec![std::ptr::null_mut(); n];
        if n > 0 {
            // SAFETY: zeroed edge data is valid plain data; both buffers hold `n` entries.
            let mut edges: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; n];
            unsafe {
                if with_edges {
                    check(
                        NAME,
                        sys::cuGraphNodeGetDependencies_v2(node, deps.as_mut_ptr(), edges.as_mut_ptr(), &mut n),
                    )?
                } else {
                    check(NAME, sys::cuGraphNodeGetDependencies(node, deps.as_mut_ptr(), &mut n))?
                }
            };
            deps.truncate(n);
        }
        Ok(deps)
    }

    /// Writes CUDA's own DOT dump of the graph to `path`.
    pub(crate) fn debug_dot(&self, g: &RawGraph, path: &std::path::Path) -> Result<()> {
        let c = std::ffi::CString::new(path.to_string_lossy().as_bytes())
            .map_err(|e| GraphError::debug_dump(path, &std::io::Error::from(e)))?;
        // SAFETY: valid graph and NUL-terminated path.
        unsafe { check("cuGraphDebugDotPrint", sys::cuGraphDebugDotPrint(g.graph, c.as_ptr(), 1)) }
    }
}

/// Where a conditional body is captured: the stream, its capture mode, the IF node (in the
/// graph the stream captures into), the node's body graph and the nodes the IF node depends on.
struct BodyPlace {
    stream: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
    node: sys::CUgraphNode,
    body: sys::CUgraph,
    deps: Vec<sys::CUgraphNode>,
    /// For a WHILE body: what its kernels may do with the node's condition.
    fold: Option<LoopFold>,
}

/// Whether a WHILE body's last kernel sets the node's condition where it can
/// ([`CudaBackend::capture_while`]): the default (0.6% to 1.1% less a token at batches 1 to 4 on
/// an H100, within 0.5% either way at 8 to 64); `GRAPHED_FOLD_CONDITION=0` (read once a process) keeps the separate
/// condition kernel.
fn fold_requested() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !std::env::var("GRAPHED_FOLD_CONDITION").is_ok_and(|v| v == "0"))
}

fn stream_mode(mode: CaptureMode) -> sys::CUstreamCaptureMode {
    match mode {
        CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        CaptureMode::ThreadLocal => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    }
}

/// The graph `stream` captures into and the nodes the next captured node will depend on
/// (`cuStreamGetCaptureInfo`, CUDA 12.3's third version). The context is bound.
fn capture_info(stream: sys::CUstream) -> Result<(sys::CUgraph, Vec<sys::CUgraphNode>)> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut count = 0usize;
    // Edge data is asked for (and not read) because the driver refuses to leave it out where
    // an edge carries some (a programmatic launch's, `GRAPHED_PDL=1`): what the caller adds
    // after these nodes waits for them whole, which is stronger than any such edge.
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    // SAFETY: every output points to a local; the id is an optional output left null. The
    // arrays are valid until the next call on the stream, and are copied before that.
    unsafe {
        check(
            "cuStreamGetCaptureInfo",
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                std::ptr::null_mut(),
                &mut graph,
                &mut deps,
                &mut edges,
                &mut count,
            ),
        )?
    };
    match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => {}
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
            return Err(Error::CaptureInvalidated { cause: Invalidation::BeforeConditionalBody })
        }
        _ => return Err(Error::NotCapturing { graph: "this device's stream".into() }),
    }
    let deps = if count == 0 || deps.is_null() {
        Vec::new()
    } else {
        // SAFETY: the driver's array of `count` nodes, read at once (see above).
        unsafe { std::slice::from_raw_parts(deps, count) }.to_vec()
    };
    Ok((graph, deps))
}

/// Ends the stream's capture; the graph it captured into (a null graph: the capture was
/// invalidated).
fn end_stream_capture(stream: sys::CUstream) -> Result<sys::CUgraph> {
    // SAFETY: the stream is ours and capturing (the caller's state says so).
    let g = unsafe { result::stream::end_capture(stream) }.map_err(driver_err("cuStreamEndCapture"))?;
    if g.is_null() {
        return Err(Error::CaptureInvalidated { cause: Invalidation::IllegalInConditionalBody });
    }
    Ok(g)
}

/// Adds an empty node (no work) to `graph`, with no dependencies.
fn add_empty_node(graph: sys::CUgraph) -> Result<()> {
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: `graph` is live and no capture uses it; the node is owned by the graph.
    unsafe { check("cuGraphAddEmptyNode", sys::cuGraphAddEmptyNode(&mut node, graph, std::ptr::null(), 0)) }
}

/// Adds a WHILE or IF node over `handle` to `graph` after `deps`, with `size` bodies (an IF
/// node's second body runs where the condition is zero: CUDA 12.8); the node and its body
/// graphs (owned by the node), in order.
fn add_conditional_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    handle: sys::CUgraphConditionalHandle,
    kind: CondKind,
    size: u32,
    ctx: sys::CUcontext,
) -> Result<(sys::CUgraphNode, Vec<sys::CUgraph>)> {
    // SAFETY: zeroed node params are valid (plain data and null pointers); we set the type
    // and the conditional member, the one the driver reads for this type.
    let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
    params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
    params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
        handle,
        type_: match kind {
            CondKind::While => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
            CondKind::If => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
        },
        size,
        phGraph_out: std::ptr::null_mut(),
        ctx,
    };
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    let deps_ptr = if deps.is_empty() { std::ptr::null() } else { deps.as_ptr() };
    // SAFETY: a valid graph, valid dependencies (outliving the call), params as above; the
    // driver fills `phGraph_out` with an array (owned by the node) of `size` body graphs.
    unsafe { check("cuGraphAddNode", sys::cuGraphAddNode(&mut node, graph, deps_ptr, deps.len(), &mut params))? };
    // SAFETY: reading the member we wrote, which the driver updated.
    let bodies = unsafe { params.__bindgen_anon_1.conditional.phGraph_out };
    if bodies.is_null() {
        return Err(GraphError::ConditionalWithoutBody.into());
    }
    // SAFETY: `bodies` points to `size` graphs owned by the node, alive as long as it is.
    let bodies = unsafe { std::slice::from_raw_parts(bodies, size as usize) }.to_vec();
    if bodies.iter().any(|b| b.is_null()) {
        return Err(GraphError::ConditionalWithoutBody.into());
    }
    Ok((node, bodies))
}

/// Adds a one-thread kernel node that sets the conditional `handle` from `test`, after `deps`.
fn add_set_conditional(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    func: &CudaFunction,
    handle: sys::CUgraphConditionalHandle,
    test: &CondTest,
) -> Result<sys::CUgraphNode> {
    // The kernel's parameters: (handle, const void* value, u32 is_i32, u32 below, float limit).
    let (mut h, mut value, mut is_i32, mut below, mut limit) =
        (handle, test.ptr, test.is_i32 as u32, test.below.is_some() as u32, test.below.unwrap_or(0.0));
    let mut args: [*mut c_void; 5] = [
        (&mut h) as *mut u64 as *mut c_void,
        (&mut value) as *mut u64 as *mut c_void,
        (&mut is_i32) as *mut u32 as *mut c_void,
        (&mut below) as *mut u32 as *mut c_void,
        (&mut limit) as *mut f32 as *mut c_void,
    ];
    let p = sys::CUDA_KERNEL_NODE_PARAMS {
        func: func.cu_function(),
        gridDimX: 1,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 1,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: args.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    };
    let mut node: sys::CUgraphNode = std::ptr::null_mut();
    let deps_ptr = if deps.is_empty() { std::ptr::null() } else { deps.as_ptr() };
    // SAFETY: a valid graph and function loaded on the current context; the argument values
    // and the pointer array outlive the call, which copies them into the node.
    unsafe { check("cuGraphAddKernelNode", sys::cuGraphAddKernelNode_v2(&mut node, graph, deps_ptr, deps.len(), &p))? };
    Ok(node)
}
