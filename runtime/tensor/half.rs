//! bf16, f16 and i32 tensors: constructors from 16-bit values, from i32 and from f32, and
//! read-back.

use half::{bf16, f16};

use super::values_fit;
use crate::backend::BackendKind;
use crate::error::OpError;
use crate::{DType, Device, Error, Result, ShapeProblem, Tensor};

impl Tensor {
    /// A tensor of `dtype` holding `data` rounded to it (round to nearest even, as the GPU
    /// kernels store). Illegal during capture.
    ///
    /// ```
    /// use graphed::{DType, Device, Tensor};
    /// let t = Tensor::from_slice_as(&Device::host(), &[1.0, 1.0 + 1.0 / 256.0], &[2], DType::BF16)?;
    /// assert_eq!(t.to_vec()?, vec![1.0, 1.0]); // 1 + 2^-8 is a tie in bf16: rounds to even
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn from_slice_as(device: &Device, data: &[f32], dims: &[usize], dtype: DType) -> Result<Tensor> {
        values_fit(device, "Tensor::from_slice_as", data.len(), dims)?;
        let t = Tensor::empty_as(device, dims, dtype)?;
        t.copy_from_slice(data)?;
        Ok(t)
    }

    /// A bf16 tensor holding `data` exactly. Illegal during capture.
    ///
    /// ```
    /// use graphed::{half::bf16, Device, Tensor};
    /// let t = Tensor::from_bf16(&Device::host(), &[bf16::from_f32(0.5), bf16::ONE], &[2])?;
    /// assert_eq!(t.to_bf16_vec()?, vec![bf16::from_f32(0.5), bf16::ONE]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn from_bf16(device: &Device, data: &[bf16], dims: &[usize]) -> Result<Tensor> {
        let bits: Vec<u16> = data.iter().map(|v| v.to_bits()).collect();
        Tensor::from_bits16(device, &bits, dims, DType::BF16)
    }

    /// An f16 tensor holding `data` exactly. Illegal during capture.
    ///
    /// ```
    /// use graphed::{half::f16, Device, Tensor};
    /// let t = Tensor::from_f16(&Device::host(), &[f16::MAX], &[1])?;
    /// assert_eq!(t.to_vec()?, vec![65504.0]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn from_f16(device: &Device, data: &[f16], dims: &[usize]) -> Result<Tensor> {
        let bits: Vec<u16> = data.iter().map(|v| v.to_bits()).collect();
        Tensor::from_bits16(device, &bits, dims, DType::F16)
    }

    /// A tensor of `dtype` filled with `value` (rounded to the dtype).
    ///
    /// ```
    /// use graphed::{DType, Device, Tensor};
    /// let t = Tensor::full_as(&Device::host(), &[3], 0.1, DType::F16)?;
    /// assert_eq!(t.to_vec()?, vec![DType::F16.round(0.1); 3]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn full_as(device: &Device, dims: &[usize], value: f32, dtype: DType) -> Result<Tensor> {
        let t = Tensor::empty_as(device, dims, dtype)?;
        let n = u32::try_from(t.numel()).map_err(|_| OpError::TooLarge {
            op: "Tensor::full",
            what: "element count",
            got: t.numel(),
            max: u32::MAX as usize,
        })?;
        device.backend().fill(&t.ptr()?, n, value, dtype)?;
        Ok(t)
    }

    /// A tensor of `dtype` of zeros.
    pub fn zeros_as(device: &Device, dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full_as(device, dims, 0.0, dtype)
    }

    /// The contents of a bf16 tensor, bit for bit. Illegal during capture.
    pub fn to_bf16_vec(&self) -> Result<Vec<bf16>> {
        self.expect_dtype("Tensor::to_bf16_vec", DType::BF16)?;
        Ok(self.to_bits16()?.into_iter().map(bf16::from_bits).collect())
    }

    /// The contents of an f16 tensor, bit for bit. Illegal during capture.
    pub fn to_f16_vec(&self) -> Result<Vec<f16>> {
        self.expect_dtype("Tensor::to_f16_vec", DType::F16)?;
        Ok(self.to_bits16()?.into_iter().map(f16::from_bits).collect())
    }

    fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.dtype() != dtype {
            return Err(Error::DType { op, got: self.dtype(), expected: dtype });
        }
        Ok(())
    }

    fn from_bits16(device: &Device, bits: &[u16], dims: &[usize], dtype: DType) -> Result<Tensor> {
        values_fit(device, "Tensor::from_bf16/from_f16", bits.len(), dims)?;
        let t = Tensor::empty_as(device, dims, dtype)?;
        t.write_bits16(bits)?;
        Ok(t)
    }

    /// Overwrites a bf16 or f16 tensor with raw 16-bit patterns, exactly (a NaN's payload too,
    /// which a trip through f32 may change). Illegal during capture.
    pub(crate) fn copy_from_bits16(&self, bits: &[u16]) -> Result<()> {
        if !matches!(self.dtype(), DType::BF16 | DType::F16) {
            return Err(Error::DType { op: "Tensor::copy_from_bits16", got: self.dtype(), expected: DType::BF16 });
        }
        if self.numel() != bits.len() {
            return Err(Error::shape("Tensor::copy_from_bits16", ShapeProblem::values(bits.len(), self.dims())));
        }
        self.write_bits16(bits)
    }

    fn write_bits16(&self, bits: &[u16]) -> Result<()> {
        let backend = self.device().backend();
        backend.forbid_during_capture("copy from host memory")?;
        match &backend.kind {
            BackendKind::Cuda(c) => c.copy_to_device(self.cuda_ptr()?, bits),
            BackendKind::Host(_) => {
                self.host_ptr()?.write_bits16(bits);
                Ok(())
            }
        }
    }

    /// An [`DType::I32`] tensor holding `data` exactly (lengths and positions the device reads).
    /// Illegal during capture.
    ///
    /// ```
    /// use graphed::{DType, Device, Tensor};
    /// let t = Tensor::from_i32(&Device::host(), &[3, -1, i32::MAX], &[3])?;
    /// assert_eq!((t.dtype(), t.to_i32_vec()?), (DType::I32, vec![3, -1, i32::MAX]));
    /// assert_eq!(t.to_vec()?, vec![3.0, -1.0, 2147483648.0]); // as f32: rounded
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn from_i32(device: &Device, data: &[i32], dims: &[usize]) -> Result<Tensor> {
        values_fit(device, "Tensor::from_i32", data.len(), dims)?;
        let t = Tensor::empty_as(device, dims, DType::I32)?;
        t.write_i32(data)?;
        Ok(t)
    }

    /// Overwrites an [`DType::I32`] tensor with `data`, exactly. Illegal during capture.
    pub fn copy_from_i32(&self, data: &[i32]) -> Result<()> {
        self.expect_dtype("Tensor::copy_from_i32", DType::I32)?;
        if self.numel() != data.len() {
            return Err(Error::shape("Tensor::copy_from_i32", ShapeProblem::values(data.len(), self.dims())));
        }
        self.write_i32(data)
    }

    fn write_i32(&self, data: &[i32]) -> Result<()> {
        let backend = self.device().backend();
        backend.forbid_during_capture("copy from host memory")?;
        match &backend.kind {
            BackendKind::Cuda(c) => c.copy_to_device(self.cuda_ptr()?, data),
            BackendKind::Host(_) => {
                self.host_ptr()?.write_i32(data);
                Ok(())
            }
        }
    }

    /// The contents of an [`DType::I32`] tensor, exactly. Illegal during capture.
    pub fn to_i32_vec(&self) -> Result<Vec<i32>> {
        self.expect_dtype("Tensor::to_i32_vec", DType::I32)?;
        let backend = self.device().backend();
        backend.forbid_during_capture("copy to host memory")?;
        match &backend.kind {
            BackendKind::Cuda(c) => {
                let mut out = vec![0i32; self.numel()];
                c.copy_to_host(&mut out, self.cuda_ptr()?)?;
                Ok(out)
            }
            BackendKind::Host(_) => Ok(self.host_ptr()?.read_i32()),
        }
    }

    /// The raw 16-bit patterns of a bf16 or f16 tensor.
    pub(crate) fn to_bits16(&self) -> Result<Vec<u16>> {
        let backend = self.device().backend();
        backend.forbid_during_capture("copy to host memory")?;
        match &backend.kind {
            BackendKind::Cuda(c) => {
                let mut out = vec![0u16; self.numel()];
                c.copy_to_host(&mut out, self.cuda_ptr()?)?;
                Ok(out)
            }
            BackendKind::Host(_) => Ok(self.host_ptr()?.read_bits16()),
        }
    }
}
