//! Shared test helpers: the backends to run each behaviour on, and deterministic data.
#![allow(dead_code)]

use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use graphed::{Device, Error, Result, Tensor};

/// CUDA tests share one device and one stream: run them one at a time.
static CUDA_LOCK: Mutex<()> = Mutex::new(());

/// A backend under test; holds the CUDA lock while alive.
pub struct Backend {
    pub device: Device,
    _guard: Option<MutexGuard<'static, ()>>,
}

/// Runs `f` on every available backend: the host always, CUDA when a GPU is usable.
/// Set `GRAPHED_REQUIRE_CUDA=1` to fail instead of skipping when no GPU is usable.
pub fn on_each_backend(mut f: impl FnMut(&Device) -> Result<()>) {
    for b in backends() {
        if let Err(e) = f(&b.device) {
            panic!("on {}: {e}", b.device.name());
        }
    }
}

pub fn backends() -> Vec<Backend> {
    let mut v = vec![Backend { device: Device::host(), _guard: None }];
    let guard = CUDA_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    match Device::cuda(0) {
        Ok(device) => v.push(Backend { device, _guard: Some(guard) }),
        Err(e) => {
            if std::env::var("GRAPHED_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("GRAPHED_REQUIRE_CUDA=1 but CUDA is unusable: {e}");
            }
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| say_skipped(&format!("note: the CUDA half of these tests is skipped: {e}")));
        }
    }
    v
}

/// Whether `dev` captures an if/else (`Condition::run_if_else`) into one IF node with an else
/// body: a CUDA driver for 12.8 or later, unless `GRAPHED_IF_ELSE_NODE=0` asks for the two IF
/// nodes of older drivers.
pub fn if_else_in_one_node(dev: &Device) -> bool {
    dev.capabilities().driver.is_some_and(|v| v >= graphed::CudaVersion(12080))
        && std::env::var("GRAPHED_IF_ELSE_NODE").map_or(true, |v| v != "0")
}

/// The examples' model and synthetic data, shared with the tests.
#[path = "../../examples/common/model.rs"]
pub mod model;

/// Deterministic pseudo-random values in [-1, 1), so tests never run on zeros.
pub fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    model::data::random_vec(n, seed, 1.0)
}

pub fn random(dev: &Device, dims: &[usize], seed: u64) -> Result<Tensor> {
    Tensor::from_slice(dev, &random_vec(dims.iter().product(), seed), dims)
}

/// ‖a − b‖ / ‖b‖ in f64.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((*x as f64) - (*y as f64)).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Whether a test that needs `ranks` GPUs runs here (in a rank process it always does); when it
/// does not, says so and why. `GRAPHED_REQUIRE_MULTI_GPU=1` makes too few GPUs (or no NCCL) a
/// failure instead of a skip.
pub fn gpus_here(test: &str, ranks: usize) -> bool {
    use graphed::dist;
    if matches!(dist::RankEnv::from_env(), Ok(Some(_))) {
        return true;
    }
    let required = std::env::var("GRAPHED_REQUIRE_MULTI_GPU").is_ok_and(|v| v == "1");
    let wanted = required || std::env::var("GRAPHED_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    let gpus = dist::gpu_count();
    if required && gpus < ranks {
        panic!("GRAPHED_REQUIRE_MULTI_GPU=1 but only {gpus} GPU(s) are usable");
    }
    if !wanted || gpus < ranks {
        say_skipped(&format!(
            "{test}: skipped: {gpus} GPU(s) usable here, it needs {ranks} (set GRAPHED_REQUIRE_CUDA=1 on a machine with {ranks}+)"
        ));
        return false;
    }
    match dist::nccl_version() {
        Ok(_) => true,
        Err(e) if required => panic!("GRAPHED_REQUIRE_MULTI_GPU=1 but {e}"),
        Err(e) => {
            say_skipped(&format!("{test}: skipped: {e}"));
            false
        }
    }
}

/// Says that (part of) a test was skipped and why, on the process's real stderr: the test
/// harness captures `println!`/`eprintln!` of a passing test and would hide it, so a skipped
/// test would pass silently.
pub fn say_skipped(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// A free loopback port (free when asked; a test binds it soon after).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    l.local_addr().expect("an address").port()
}

/// A port whose next port is free too (torchrun's store holds the first, we the second).
pub fn free_port_pair() -> u16 {
    loop {
        let p = free_port();
        if p > 1 && std::net::TcpListener::bind(("127.0.0.1", p - 1)).is_ok() {
            return p - 1;
        }
    }
}

/// Every variable a launcher might have left in this process, removed from the ranks' so that
/// each test's ranks see only the launcher it plays.
const LAUNCHER_VARS: [&str; 21] = [
    "GRAPHED_RANK",
    "GRAPHED_WORLD_SIZE",
    "GRAPHED_LOCAL_RANK",
    "GRAPHED_RENDEZVOUS",
    "GRAPHED_LAUNCHER",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODELIST",
    "SLURM_JOB_ID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
];

/// Plays another launcher: starts `world` copies of this binary running `test`, rank `r` with
/// the variables `vars(r)` (and none of graphed's), and waits for all of them, each until
/// `deadline` has passed since the start.
pub fn play_launcher(
    test: &str,
    world: usize,
    deadline: Duration,
    vars: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::msg(e.to_string()))?;
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..world {
        let mut cmd = Command::new(&exe);
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1"]);
        for v in LAUNCHER_VARS {
            cmd.env_remove(v);
        }
        let child = cmd.envs(vars(rank)).env("NCCL_NVLS_ENABLE", "0").spawn();
        children.push(child.map_err(|e| Error::msg(format!("rank {rank} could not start: {e}")))?);
    }
    let end = Instant::now() + deadline;
    let mut failed = None;
    for (rank, mut child) in children.into_iter().enumerate() {
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => break,
                Ok(Some(status)) => {
                    failed.get_or_insert(format!("rank {rank} exited with {status}"));
                    break;
                }
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    failed.get_or_insert(format!("rank {rank} did not end within {deadline:?}"));
                    break;
                }
            }
        }
    }
    failed.map_or(Ok(()), |f| Err(Error::msg(f)))
}
