//! Measures the two ways a graph pool can be built, on the GPU, to back the allocator decision
//! (docs/DESIGN-DECISIONS.md): our caching allocator over slabs, and CUDA graph memory nodes
//! (`cuMemAllocAsync` inside the capture).
//!
//! The workload mimics a chain of per-layer graphs: L graphs captured one after the other; each
//! allocates a temporary of S bytes, fills it, copies it into an output that must outlive the
//! graph (a static output), and frees the temporary. With memory nodes a static output cannot
//! be allocated inside its graph (the graph could not be relaunched until someone freed it), so
//! outputs are plain allocations made before capture.
//!
//! Run: `cargo run --release --example pool_compare` (needs a GPU; prints a skip line otherwise).

use std::time::Instant;

use clap::Parser;
use cudarc::driver::{result, sys, CudaContext};
use graphed::{ops, CaptureMode, Device, Graph, Tensor};

const L: usize = 32;
const ELEMS: usize = 256 * 1024; // 1 MiB of f32 per temporary and per output
const REPLAYS: usize = 200;

/// The slab graph pool against CUDA graph memory nodes: capture time, replay time and bytes of
/// 32 graphs (needs a GPU).
#[derive(Parser)]
#[command(name = "pool_compare", after_help = "It takes no flags.")]
struct Args {}

fn main() -> graphed::Result<()> {
    Args::parse();
    let dev = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("pool_compare: skipped, no usable GPU ({e})");
            return Ok(());
        }
    };
    println!("pool_compare on {}: {L} graphs, each a {} KiB temporary + a static output", dev.name(), ELEMS * 4 / 1024);

    // A. Slab pool: all graphs share one pool; each temporary is freed inside its capture, so
    // the next capture reuses it.
    let pool = dev.new_pool();
    let src = Tensor::full(&dev, &[ELEMS], 1.0)?;
    let t0 = Instant::now();
    let mut graphs = Vec::new();
    let mut outputs = Vec::new();
    for i in 0..L {
        let mut g = Graph::with_pool(&dev, &pool);
        let out = g.capture(CaptureMode::Global, || {
            let tmp = Tensor::empty(&dev, &[ELEMS])?;
            ops::copy_(&tmp, &src)?;
            ops::scale_(&tmp, i as f32)?;
            let out = Tensor::empty(&dev, &[ELEMS])?;
            ops::copy_(&out, &tmp)?;
            Ok(out)
        })?;
        graphs.push(g);
        outputs.push(out);
    }
    dev.synchronize()?;
    let slab_capture_ms = t0.elapsed().as_secs_f64() * 1e3;
    let st = pool.stats();
    let slab_ms = dev.time_ms(|| {
        for _ in 0..REPLAYS {
            for g in graphs.iter_mut() {
                g.replay()?;
            }
        }
        Ok(())
    })?;
    let want = outputs[5].to_vec()?;
    assert!(want.iter().all(|v| *v == 5.0), "slab pool result wrong");
    println!(
        "slab pool:    capture {slab_capture_ms:8.2} ms   replay {:7.2} us/graph   reserved {:6.2} MiB (live needed {:.2} MiB: {L} outputs + 1 temporary)",
        slab_ms as f64 * 1e3 / (REPLAYS * L) as f64,
        st.reserved as f64 / 1048576.0,
        ((L + 1) * ELEMS * 4) as f64 / 1048576.0
    );

    // B. Graph memory nodes through the driver API directly.
    let ctx = CudaContext::new(0).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
    let stream = ctx.new_stream().map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
    let bytes = ELEMS * 4;
    let cu = |r: Result<(), result::DriverError>| r.map_err(|e| graphed::Error::msg(format!("{e:?}")));
    // SAFETY: measurement code at the FFI edge: every pointer below is allocated here with the
    // size used, every graph is destroyed before its memory is freed, and the stream is
    // synchronized before anything is read or freed.
    unsafe {
        let src_b = result::malloc_sync(bytes).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
        cu(sys::cuMemsetD32Async(src_b, 1.0f32.to_bits(), ELEMS, stream.cu_stream()).result())?;
        let outs: Vec<u64> = (0..L).map(|_| result::malloc_sync(bytes).unwrap_or(0)).collect();
        let t0 = Instant::now();
        let mut execs = Vec::new();
        for (i, out) in outs.iter().enumerate() {
            cu(result::stream::begin_capture(
                stream.cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            ))?;
            let tmp =
                result::malloc_async(stream.cu_stream(), bytes).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
            cu(sys::cuMemsetD32Async(tmp, (i as f32).to_bits(), ELEMS, stream.cu_stream()).result())?;
            cu(result::memcpy_dtod_async(*out, tmp, bytes, stream.cu_stream()))?;
            cu(result::free_async(tmp, stream.cu_stream()))?;
            let g =
                result::stream::end_capture(stream.cu_stream()).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
            let exec = result::graph::instantiate(g, sys::CUgraphInstantiate_flags(0))
                .map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
            cu(result::graph::upload(exec, stream.cu_stream()))?;
            execs.push((g, exec));
        }
        cu(stream.synchronize())?;
        let node_capture_ms = t0.elapsed().as_secs_f64() * 1e3;
        // Timing needs events created with CU_EVENT_DEFAULT (cudarc's default disables timing).
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(timed).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
        let end = ctx.new_event(timed).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
        start.record(&stream).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
        for _ in 0..REPLAYS {
            for (_, exec) in &execs {
                cu(result::graph::launch(*exec, stream.cu_stream()))?;
            }
        }
        end.record(&stream).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
        end.synchronize().map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
        let node_ms = start.elapsed_ms(&end).map_err(|e| graphed::Error::msg(format!("{e:?}")))?;
        let mut reserved: u64 = 0;
        sys::cuDeviceGetGraphMemAttribute(
            ctx.cu_device(),
            sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
            &mut reserved as *mut u64 as *mut std::ffi::c_void,
        );
        println!(
            "memory nodes: capture {node_capture_ms:8.2} ms   replay {:7.2} us/graph   reserved {:6.2} MiB graph memory + {:.2} MiB outputs outside it",
            node_ms as f64 * 1e3 / (REPLAYS * L) as f64,
            reserved as f64 / 1048576.0,
            (L * bytes) as f64 / 1048576.0
        );
        for (g, exec) in execs {
            let _ = result::graph::exec_destroy(exec);
            let _ = result::graph::destroy(g);
        }
        for o in outs {
            let _ = result::free_sync(o);
        }
        let _ = result::free_sync(src_b);
    }
    Ok(())
}
