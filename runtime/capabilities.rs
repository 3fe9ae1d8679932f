//! What the CUDA stack under a device offers: the driver's CUDA version and the optional
//! features graphed can use, found without calling a function the driver or a library lacks.

use std::fmt;

/// A CUDA version as the driver API encodes it: `1000 * major + 10 * minor` (12040 is 12.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion(pub u32);

impl CudaVersion {
    /// The CUDA API level graphed is built against (cudarc's `cuda-12040` bindings): every
    /// driver entry point and struct layout it uses is CUDA 12.4's.
    pub const API_LEVEL: CudaVersion = CudaVersion(12040);

    /// The oldest driver graphed opens a device on: CUDA 12.0 (R525 drivers). Every driver
    /// function graphed calls exists there, except those that [`Capabilities`] reports and the
    /// runtime only calls when the driver has them.
    pub const MIN_DRIVER: CudaVersion = CudaVersion(12000);

    /// Conditional graph nodes with bodies captured from a stream (CUDA 12.4).
    pub const CONDITIONAL_NODES: CudaVersion = CudaVersion(12040);

    /// The major version (12 for 12.4).
    pub fn major(self) -> u32 {
        self.0 / 1000
    }

    /// The minor version (4 for 12.4).
    pub fn minor(self) -> u32 {
        self.0 % 1000 / 10
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// What a device's CUDA stack offers, from [`crate::Device::capabilities`].
///
/// Each optional feature is probed the safe way: the driver's version through
/// `cuDriverGetVersion` when the device opens, a library by loading it by name. Nothing here
/// (or anywhere in graphed) calls a driver function that the driver reports it lacks, so an
/// old driver or a missing library is a `false`/`None` here or a typed error elsewhere, never
/// a missing-symbol crash. On the host backend every field is `None` or `false`: it needs none
/// of them (it runs every op, graph and emulated rank on the CPU).
///
/// ```
/// use graphed::{CudaVersion, Device};
/// let dev = Device::default_device();
/// let caps = dev.capabilities();
/// println!("{}: {caps}", dev.name());
/// if dev.is_host() {
///     assert_eq!(caps.driver, None);
///     assert!(!caps.conditional_nodes && !caps.cublas_lt);
/// } else {
///     assert!(caps.driver >= Some(CudaVersion::MIN_DRIVER));
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The newest CUDA version the driver supports (`cuDriverGetVersion`); `None` on the host.
    pub driver: Option<CudaVersion>,
    /// Whether the driver has conditional graph nodes with stream-captured bodies (CUDA 12.4,
    /// [`CudaVersion::CONDITIONAL_NODES`]), what device-side loops and skips inside a graph
    /// need.
    pub conditional_nodes: bool,
    /// Whether cublasLt loaded, so `ops::linear_fused` runs its bias and GELU epilogues inside
    /// the GEMM; without it the same call runs the unfused ops.
    pub cublas_lt: bool,
    /// NCCL's version (`ncclGetVersion`: 22703 is 2.27.3) when `libnccl.so` loads on a GPU
    /// machine; `None` otherwise, and then `graphed::dist` on GPUs is
    /// [`crate::DistError::NcclUnavailable`].
    pub nccl: Option<u32>,
}

impl Capabilities {
    /// The host backend's report: no CUDA, nothing optional.
    pub(crate) fn host() -> Capabilities {
        Capabilities { driver: None, conditional_nodes: false, cublas_lt: false, nccl: None }
    }

    /// A CUDA device's report.
    pub(crate) fn cuda(driver: CudaVersion, cublas_lt: bool, nccl: Option<u32>) -> Capabilities {
        Capabilities {
            driver: Some(driver),
            conditional_nodes: driver >= CudaVersion::CONDITIONAL_NODES,
            cublas_lt,
            nccl,
        }
    }
}

/// `2.27.3` from NCCL's `22703` (and `2.8.4` from the pre-2.9 `2804`).
fn nccl_version(v: u32) -> String {
    if v >= 10000 {
        format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100)
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(driver) = self.driver else {
            return f.write_str("host backend (no CUDA)");
        };
        let yes = |b: bool| if b { "yes" } else { "no" };
        write!(
            f,
            "CUDA driver {driver} (graphed built for the {} API), conditional nodes: {}, cublasLt: {}, NCCL: {}",
            CudaVersion::API_LEVEL,
            yes(self.conditional_nodes),
            yes(self.cublas_lt),
            self.nccl.map_or_else(|| "not found".into(), nccl_version)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_and_gate_conditional_nodes() {
        assert_eq!(CudaVersion(12040).to_string(), "12.4");
        assert_eq!(CudaVersion(13000).to_string(), "13.0");
        assert_eq!(nccl_version(22703), "2.27.3");
        assert_eq!(nccl_version(2804), "2.8.4");
        assert!(!Capabilities::cuda(CudaVersion(12020), true, None).conditional_nodes);
        assert!(Capabilities::cuda(CudaVersion(12040), true, None).conditional_nodes);
        let caps = Capabilities::cuda(CudaVersion(13000), true, Some(22703));
        assert_eq!(
            caps.to_string(),
            "CUDA driver 13.0 (graphed built for the 12.4 API), conditional nodes: yes, cublasLt: yes, NCCL: 2.27.3"
        );
        assert_eq!(Capabilities::host().to_string(), "host backend (no CUDA)");
    }
}
