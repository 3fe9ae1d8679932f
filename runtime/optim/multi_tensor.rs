//! Multi-tensor launches: one kernel over every element of many tensors, from a table of their
//! pointers built once in device memory (`kernels/multi_tensor.cu`).
//!
//! PyTorch's fused AdamW and apex's `multi_tensor_apply` pack the pointers of up to a few dozen
//! tensors into each launch's arguments, so a step over a model is several launches and each
//! packs its arguments again. Here an optimizer builds its table when it is made: one entry a
//! tensor (its pointers by slot and its element count) and one a chunk of
//! [`MultiTensor::CHUNK`] elements (the tensor and the first element), both in the default
//! pool. A step is then one launch (one a kernel: AdamW over bf16 and f16 weights at once is
//! two) with one block a chunk, and nothing is built or copied at step time. The pointers never
//! change (the optimizer holds the tensors), so a captured launch reads the same table at every
//! replay.

use super::Launches;
use crate::backend::{BuiltinKernel, CudaBackend, HostPtr, KArg, MultiTensor};
use crate::error::{DeviceError, OpError};
use crate::ops::{exec, fill_, Exec};
use crate::{Device, Param, Result, Tensor};

/// The slot of the f32 weights (the master weights in mixed precision).
pub(super) const P: usize = 0;
/// The slot of the f32 grads: what the unscale and zeroing kernels read.
pub(super) const G: usize = 1;
/// The slot of the first moment.
pub(super) const M: usize = 2;
/// The slot of the second moment.
pub(super) const V: usize = 3;
/// The slot of the 16-bit model weights.
pub(super) const MODEL: usize = 4;

/// One tensor's row: the tensors in its slots (all of one element count).
pub(super) type Row = [Option<Tensor>; MultiTensor::SLOTS];

/// The rows of a table as the host backend reads them.
pub(super) type HostRows = Vec<[Option<HostPtr>; MultiTensor::SLOTS]>;

/// An optimizer's tables: one a kernel (one, or one per 16-bit dtype of mixed-precision model
/// weights), a row a parameter.
#[derive(Debug)]
pub(super) struct Tables(Vec<(BuiltinKernel, TensorTable)>);

impl Tables {
    /// A row a parameter of `params` (the f32 masters when `model` is given): its weight and
    /// grad in [`P`] and [`G`], the optimizer's own tensors put in by `state(i, row)`, and the
    /// 16-bit model weight in [`MODEL`]; grouped into a table a kernel, `kernels` naming the
    /// kernel for f32 (or no) model weights, bf16 and f16 ones. The caller checked the model.
    pub(super) fn build(
        op: &'static str,
        device: &Device,
        params: &[Param],
        model: Option<&[Param]>,
        kernels: [BuiltinKernel; 3],
        state: impl Fn(usize, &mut Row),
    ) -> Result<Tables> {
        let mut groups: Vec<(BuiltinKernel, Vec<Row>)> = Vec::new();
        for (i, p) in params.iter().enumerate() {
            let model_value = model.and_then(|ms| ms.get(i)).map(|mp| mp.value.clone());
            let kernel = match model_value.as_ref().map(Tensor::dtype) {
                None | Some(crate::DType::F32) | Some(crate::DType::I32) => kernels[0],
                Some(crate::DType::BF16) => kernels[1],
                Some(crate::DType::F16) => kernels[2],
            };
            let mut row = Row::default();
            row[P] = Some(p.value.clone());
            row[G] = Some(p.grad.clone());
            state(i, &mut row);
            row[MODEL] = model_value;
            match groups.iter_mut().find(|(k, _)| *k == kernel) {
                Some((_, rows)) => rows.push(row),
                None => groups.push((kernel, vec![row])),
            }
        }
        let tables = groups.into_iter().map(|(k, rows)| Ok((k, TensorTable::new(op, device, rows)?)));
        Ok(Tables(tables.collect::<Result<_>>()?))
    }

    /// Checks every table before a launch reads one (no device work).
    pub(super) fn check(&self) -> Result<()> {
        self.0.iter().try_for_each(|(_, t)| t.check())
    }

    /// Zeroes the grads of `params` (the tables' rows) as `launches` says: one launch a table,
    /// or one fill a grad. Every table is checked first, so every grad is fresh before the first
    /// is zeroed either way.
    pub(super) fn zero_grads(&self, launches: Launches, params: &[Param]) -> Result<()> {
        self.check()?;
        match launches {
            Launches::MultiTensor => self.0.iter().try_for_each(|(_, t)| t.zero_grads(None)),
            Launches::PerTensor => params.iter().try_for_each(|p| fill_(&p.grad, 0.0)),
        }
    }

    /// Each table with its kernel.
    pub(super) fn iter(&self) -> impl Iterator<Item = &(BuiltinKernel, TensorTable)> {
        self.0.iter()
    }
}

/// A table of tensors for one multi-tensor kernel. On CUDA it holds the entries and the chunk
/// list in device memory; on the host backend the rows alone (the host ops walk them).
#[derive(Debug)]
pub(super) struct TensorTable {
    device: Device,
    rows: Vec<Row>,
    table: Option<DeviceTable>,
}

/// The table in device memory: `struct MtTensor` entries and `struct MtChunk` chunks, as i32
/// words (exactly the bits the kernels read).
#[derive(Debug)]
struct DeviceTable {
    entries: Tensor,
    chunks: Tensor,
    count: u32,
}

impl TensorTable {
    /// A table of `rows` on `device`. Each row's tensors are on the device and have one
    /// element count (the caller checked both), which fits in a u32.
    pub(super) fn new(op: &'static str, device: &Device, rows: Vec<Row>) -> Result<TensorTable> {
        let table = match exec(device) {
            Exec::Host(_) => None,
            Exec::Cuda(_) => Some(DeviceTable::new(op, device, &rows)?),
        };
        Ok(TensorTable { device: device.clone(), rows, table })
    }

    /// `Err(StaleTensor)` when a tensor of the table was overwritten by a replay since the
    /// table was built (the table's pointers would still be valid, but the values are not
    /// what the caller handed over). Launches check first.
    pub(super) fn check(&self) -> Result<()> {
        self.rows.iter().flatten().flatten().try_for_each(Tensor::check_fresh)
    }

    /// The rows as host pointers (host backend).
    pub(super) fn host_rows(&self) -> Result<HostRows> {
        self.rows
            .iter()
            .map(|row| {
                let mut out: [Option<HostPtr>; MultiTensor::SLOTS] = Default::default();
                for (o, t) in out.iter_mut().zip(row) {
                    *o = t.as_ref().map(Tensor::host_ptr).transpose()?;
                }
                Ok(out)
            })
            .collect()
    }

    /// Launches `kernel` over the table (nothing when it holds no element): the table, the
    /// chunk list and the chunk length, then `args`.
    pub(super) fn launch(&self, c: &CudaBackend, kernel: BuiltinKernel, args: &[KArg]) -> Result<()> {
        let Some(t) = &self.table else {
            return Err(DeviceError::OtherBackend { op: kernel.name(), what: "a host tensor table" }.into());
        };
        if t.count == 0 {
            return Ok(());
        }
        let mut all = vec![
            KArg::Ptr(t.entries.cuda_ptr()?),
            KArg::Ptr(t.chunks.cuda_ptr()?),
            KArg::U32(MultiTensor::CHUNK as u32),
        ];
        all.extend_from_slice(args);
        c.launch(kernel, MultiTensor::dims(t.count), &all)
    }

    /// Zeroes the grads (slot [`G`]) of every tensor: always with no `flag`, else only when
    /// the loss scaler's state `flag` has its overflow flag set. One launch; the caller checked
    /// the table.
    pub(super) fn zero_grads(&self, flag: Option<&Tensor>) -> Result<()> {
        match exec(&self.device) {
            Exec::Host(h) => {
                let rows = self.host_rows()?;
                let fl = flag.map(Tensor::host_ptr).transpose()?;
                h.run(BuiltinKernel::ZeroGradsMt, move || {
                    if fl.as_ref().is_some_and(|f| f.read()[1] == 0.0) {
                        return Ok(());
                    }
                    for g in rows.iter().filter_map(|row| row[G].as_ref()) {
                        g.write(&vec![0.0; g.len]);
                    }
                    Ok(())
                })
            }
            Exec::Cuda(c) => {
                let flag = flag.map(Tensor::cuda_ptr).transpose()?.unwrap_or(0);
                self.launch(c, BuiltinKernel::ZeroGradsMt, &[KArg::Ptr(flag)])
            }
        }
    }
}

impl DeviceTable {
    fn new(op: &'static str, device: &Device, rows: &[Row]) -> Result<DeviceTable> {
        let mut entries = Vec::with_capacity(rows.len() * MultiTensor::ENTRY_WORDS);
        let mut chunks = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let n = row.iter().flatten().next().map_or(0, Tensor::numel);
            for t in row {
                let ptr = t.as_ref().map(Tensor::cuda_ptr).transpose()?.unwrap_or(0);
                entries.extend(words(ptr));
            }
            entries.extend(words(n as u64));
            let index = u32::try_from(i).map_err(|_| OpError::TooLarge {
                op,
                what: "tensor count",
                got: rows.len(),
                max: u32::MAX as usize,
            })?;
            for start in (0..n).step_by(MultiTensor::CHUNK) {
                // Element counts fit in a u32 (the optimizers check), so starts do too.
                chunks.extend([index as i32, start as u32 as i32]);
            }
        }
        // One block a chunk: the grid's x dimension holds at most 2^31 - 1 blocks.
        let count =
            u32::try_from(chunks.len() / 2).ok().filter(|c| *c <= i32::MAX as u32).ok_or(OpError::TooLarge {
                op,
                what: "chunk count of one launch",
                got: chunks.len() / 2,
                max: i32::MAX as usize,
            })?;
        let store = |words: &[i32]| {
            // Never empty: a zero-length tensor still gets an allocation the kernels never read.
            let words = if words.is_empty() { &[0][..] } else { words };
            device.with_pool(&device.default_pool(), || Tensor::from_i32(device, words, &[words.len()]))
        };
        Ok(DeviceTable { entries: store(&entries)?, chunks: store(&chunks)?, count })
    }
}

/// A 64-bit value as two i32 words, low word first (little-endian, as the device reads a u64).
fn words(v: u64) -> [i32; 2] {
    [v as u32 as i32, (v >> 32) as u32 as i32]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_splits_into_low_then_high_words() {
        assert_eq!(words(0x1234_5678_9abc_def0), [0x9abc_def0_u32 as i32, 0x1234_5678]);
        assert_eq!(words(7), [7, 0]);
    }
}
