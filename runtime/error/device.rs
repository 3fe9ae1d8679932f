//! `DeviceError`: a device that cannot do what was asked for a reason of its own (not the
//! caller's arguments, not a failed CUDA call), inside [`super::Error::Device`].

/// A device-side failure that is neither the caller's misuse nor an error a CUDA call
/// returned, as values a caller can match on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A value of one backend (a host tensor, a CUDA graph, ...) reached a device of the
    /// other. Every tensor and graph belongs to the device that made it, so this is a bug in
    /// graphed; nothing was run.
    #[error("{op}: {what} reached a device of the other backend (host and CUDA values never mix); this is a bug in graphed, please report it")]
    OtherBackend {
        /// The operation.
        op: &'static str,
        /// The value that came from the other backend.
        what: &'static str,
    },
    /// A kernel whose blocks wait for one another (the Hopper attention backward's ordered
    /// `dQ` sum, [`crate::ops::AttentionEngine::Hopper`]) gave up waits that lasted seconds, so
    /// the gradients it wrote are wrong. Its blocks only wait for work that running blocks
    /// hold, so this means a bug in graphed or a device that stopped those blocks; it is
    /// reported at the next synchronization, like a bad token id.
    #[error("{op}: a kernel gave up {waits} wait(s) for other blocks after seconds, so its output is wrong; this is a bug in graphed, please report it (AttentionEngine::Auto avoids this kernel)")]
    KernelStalled {
        /// The operation.
        op: &'static str,
        /// How many waits gave up.
        waits: u32,
    },
}
