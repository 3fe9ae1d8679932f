//! Reading a safetensors file's layout: the header, parsed and checked tensor by tensor, so
//! every problem names the tensor it is about (the format crate's own validation reports some
//! without a name). Nothing here allocates by a size the file declares before checking it
//! against the file's length.

use std::ops::Range;

use safetensors::Dtype;
use serde_json::{Map, Value};

use crate::CheckpointProblem;

/// One tensor of the file: its dtype, shape and bytes (a range of the whole file).
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<u64>,
    pub(super) bytes: Range<usize>,
}

/// A problem and the tensor it is about, if it is one tensor's.
pub(super) type Problem = (Option<String>, CheckpointProblem);

/// Every tensor of the file, checked: known dtypes, shapes that match their byte ranges,
/// ranges within the data section that tile it exactly (as the format requires).
pub(super) fn parse(file: &[u8]) -> Result<Vec<Entry>, Problem> {
    let len = file.len() as u64;
    let Some(prefix) = file.get(..8) else {
        return Err((None, CheckpointProblem::Truncated { file: len, needed: 8 }));
    };
    let header_len = u64::from_le_bytes(prefix.try_into().expect("8 bytes"));
    let data_start = header_len.saturating_add(8);
    if data_start > len {
        return Err((None, CheckpointProblem::Truncated { file: len, needed: data_start }));
    }
    let data_start = data_start as usize; // at most the file's length
    let header = std::str::from_utf8(&file[8..data_start])
        .map_err(|e| (None, CheckpointProblem::Header { detail: e.to_string() }))?;
    let map: Map<String, Value> =
        serde_json::from_str(header).map_err(|e| (None, CheckpointProblem::Header { detail: e.to_string() }))?;
    let data = len - data_start as u64;
    let mut entries = Vec::with_capacity(map.len());
    for (name, value) in map {
        if name == "__metadata__" {
            if !value.is_object() {
                return Err((None, CheckpointProblem::Metadata));
            }
            continue;
        }
        match entry(&value, data) {
            Ok((dtype, shape, begin, end)) => {
                let bytes = data_start + begin as usize..data_start + end as usize;
                entries.push(Entry { name, dtype, shape, bytes });
            }
            Err(problem) => return Err((Some(name), problem)),
        }
    }
    check_tiling(&entries, data_start, data)?;
    Ok(entries)
}

/// One entry's dtype, shape and offsets within the data section, checked.
fn entry(value: &Value, data: u64) -> Result<(Dtype, Vec<u64>, u64, u64), CheckpointProblem> {
    let field = |field| CheckpointProblem::Field { field };
    let dtype_name = value.get("dtype").and_then(Value::as_str).ok_or(field("dtype"))?;
    let dtype: Dtype = serde_json::from_value(Value::String(dtype_name.to_string()))
        .map_err(|_| CheckpointProblem::UnknownDType { dtype: dtype_name.to_string() })?;
    let shape = value
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|dims| dims.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
        .ok_or(field("shape"))?;
    let offsets = value
        .get("data_offsets")
        .and_then(Value::as_array)
        .and_then(|o| o.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
        .filter(|o| o.len() == 2)
        .ok_or(field("data_offsets"))?;
    let (begin, end) = (offsets[0], offsets[1]);
    if begin > end || end > data {
        return Err(CheckpointProblem::Offsets { begin, end, data });
    }
    let bits =
        shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d)).and_then(|n| n.checked_mul(dtype.bitsize() as u64));
    let needed = bits.map(|b| b.div_ceil(8));
    if needed != Some(end - begin) || bits.is_some_and(|b| b % 8 != 0) {
        return Err(CheckpointProblem::SizeMismatch { shape, bytes: end - begin });
    }
    Ok((dtype, shape, begin, end))
}

/// The tensors' ranges, in file order, must follow each other with no gap or overlap and end
/// where the file does.
fn check_tiling(entries: &[Entry], data_start: usize, data: u64) -> Result<(), Problem> {
    let mut order: Vec<&Entry> = entries.iter().collect();
    order.sort_by_key(|e| (e.bytes.start, e.bytes.end));
    let mut at = 0u64;
    for e in order {
        let begin = (e.bytes.start - data_start) as u64;
        if begin != at {
            return Err((Some(e.name.clone()), CheckpointProblem::Layout { expected: at, found: begin }));
        }
        at = (e.bytes.end - data_start) as u64;
    }
    if at != data {
        return Err((None, CheckpointProblem::Layout { expected: at, found: data }));
    }
    Ok(())
}
