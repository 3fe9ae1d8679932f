//! The CPU references of decoding with a KV cache: attention of one query token per sequence
//! over the first `lengths[b]` cache positions, and appending one step at each sequence's
//! length. Included in [`crate::ops::cpu`]; products and sums in f64, the softmax unrounded
//! (the CUDA kernels keep it in f32).

/// The sizes of a KV cache and of the queries that read it: `q` and the output are
/// `[batch, heads, head_dim]`, the caches `[batch, kv_heads, max_len, head_dim]`, the lengths
/// `[batch]`. `kv_heads` divides `heads`: query head `h` reads key/value head
/// `h / (heads / kv_heads)` (grouped-query attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    /// Sequences in the batch.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads: divides `heads`.
    pub kv_heads: usize,
    /// Positions each sequence's cache holds.
    pub max_len: usize,
    /// Features per head.
    pub head_dim: usize,
}

impl CacheShape {
    /// `1 / sqrt(head_dim)`, the score scale, in f32 (as the kernels use it).
    pub fn scale(self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// The dims of the caches: `[batch, kv_heads, max_len, head_dim]`.
    pub fn cache_dims(self) -> [usize; 4] {
        [self.batch, self.kv_heads, self.max_len, self.head_dim]
    }

    /// The dims of the queries and the output: `[batch, heads, head_dim]`.
    pub fn query_dims(self) -> [usize; 3] {
        [self.batch, self.heads, self.head_dim]
    }

    /// The dims of one step's keys and values: `[batch, kv_heads, head_dim]`.
    pub fn step_dims(self) -> [usize; 3] {
        [self.batch, self.kv_heads, self.head_dim]
    }

    /// The length of sequence `b` when it is in `0..=max_len`.
    fn valid(self, len: i32) -> Option<usize> {
        usize::try_from(len).ok().filter(|&l| l <= self.max_len)
    }
}

/// One query token per sequence against its cache: for sequence `b` and head `h`,
/// `p = softmax(q[b, h] · k[b, kv(h), j] · scale)` over `j < lengths[b]` and
/// `out[b, h] = Σ_j p_j v[b, kv(h), j]`. A sequence whose length is 0, or not in `0..=max_len`,
/// gets zeros. Returns the output and the first sequence whose length is out of range, with
/// that length (the op reports it as [`crate::Error::CacheLengthOutOfRange`]).
pub fn decode_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    lengths: &[i32],
    s: CacheShape,
) -> (Vec<f32>, Option<(usize, i32)>) {
    let (dh, scale) = (s.head_dim, s.scale() as f64);
    let group = s.heads / s.kv_heads;
    let mut out = vec![0.0f32; s.batch * s.heads * dh];
    let mut bad = None;
    let mut scores = Vec::with_capacity(s.max_len);
    for (b, &raw) in lengths.iter().enumerate().take(s.batch) {
        let Some(len) = s.valid(raw) else {
            bad = bad.or(Some((b, raw)));
            continue;
        };
        for h in 0..s.heads {
            let qrow = &q[(b * s.heads + h) * dh..][..dh];
            let base = (b * s.kv_heads + h / group) * s.max_len * dh;
            scores.clear();
            for j in 0..len {
                let krow = &k_cache[base + j * dh..][..dh];
                scores.push(qrow.iter().zip(krow).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale);
            }
            let m = scores.iter().fold(f64::NEG_INFINITY, |m, x| m.max(*x));
            let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
            let o = &mut out[(b * s.heads + h) * dh..][..dh];
            let mut acc = vec![0.0f64; dh];
            for (j, x) in scores.iter().enumerate() {
                let p = (x - m).exp() / z;
                for (a, v) in acc.iter_mut().zip(&v_cache[base + j * dh..][..dh]) {
                    *a += p * *v as f64;
                }
            }
            for (o, a) in o.iter_mut().zip(&acc) {
                *o = *a as f32;
            }
        }
    }
    (out, bad)
}

/// Writes one step's keys and values (`[batch, kv_heads, head_dim]`) at position `lengths[b]`
/// of each sequence's cache and increments `lengths[b]`. A sequence whose cache is full
/// (`lengths[b] == max_len`) or whose length is out of range is left unchanged; the first such
/// sequence and its length are returned (the op reports [`crate::Error::CacheFull`] or
/// [`crate::Error::CacheLengthOutOfRange`]).
pub fn kv_cache_append(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    lengths: &mut [i32],
    k: &[f32],
    v: &[f32],
    s: CacheShape,
) -> Option<(usize, i32)> {
    let dh = s.head_dim;
    let mut bad = None;
    for (b, len) in lengths.iter_mut().enumerate().take(s.batch) {
        let pos = match s.valid(*len) {
            Some(pos) if pos < s.max_len => pos,
            _ => {
                bad = bad.or(Some((b, *len)));
                continue;
            }
        };
        for h in 0..s.kv_heads {
            let src = (b * s.kv_heads + h) * dh;
            let dst = ((b * s.kv_heads + h) * s.max_len + pos) * dh;
            k_cache[dst..dst + dh].copy_from_slice(&k[src..src + dh]);
            v_cache[dst..dst + dh].copy_from_slice(&v[src..src + dh]);
        }
        *len += 1;
    }
    bad
}

/// Writes the keys and values of positions `0..seq` (`k`, `v`: `[batch, seq, kv_heads,
/// head_dim]`) into the caches at the same positions; the lengths are not touched.
pub fn kv_cache_fill(k_cache: &mut [f32], v_cache: &mut [f32], k: &[f32], v: &[f32], s: CacheShape, seq: usize) {
    let dh = s.head_dim;
    for b in 0..s.batch {
        for t in 0..seq {
            for h in 0..s.kv_heads {
                let src = ((b * seq + t) * s.kv_heads + h) * dh;
                let dst = ((b * s.kv_heads + h) * s.max_len + t) * dh;
                k_cache[dst..dst + dh].copy_from_slice(&k[src..src + dh]);
                v_cache[dst..dst + dh].copy_from_slice(&v[src..src + dh]);
            }
        }
    }
}

/// Greedy sampling: for each of `rows` rows of `cols` values, the index of the largest value,
/// the lowest index among equal ones; NaN is never chosen, and a row of NaN only gives 0.
pub fn argmax(x: &[f32], rows: usize, cols: usize) -> Vec<i32> {
    (0..rows)
        .map(|r| {
            let row = &x[r * cols..(r + 1) * cols];
            let mut best: Option<(usize, f32)> = None;
            for (j, &v) in row.iter().enumerate() {
                if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
                    best = Some((j, v));
                }
            }
            best.map_or(0, |(j, _)| j as i32)
        })
        .collect()
}

/// Sampling with a temperature and a top-k cut, by the Gumbel-max trick: for each of `rows`
/// rows, the candidate `j` with the largest `x[j] / temperature + g(u_j)`, `g(u) = -ln(-ln u)`
/// (computed in f64, rounded to f32), `u_j` the Philox uniform at counter
/// `offset + row · cols + j` with 23 random bits, in (0, 1). The candidates are the values at or
/// above the row's `top_k`-th largest (ties at the cut all stay; `top_k` 0 or at least `cols`
/// keeps the row), NaN never one; ties of the score go to the lower index. What the
/// `sample_rows` kernels compute; `temperature` is positive.
pub fn sample(x: &[f32], rows: usize, cols: usize, temperature: f32, top_k: usize, seed: u64, offset: u64) -> Vec<i32> {
    (0..rows)
        .map(|r| {
            let row = &x[r * cols..(r + 1) * cols];
            // Order-preserving keys (-0 below +0, as the kernel's radix select sees them).
            let key = |v: f32| match v.to_bits() {
                _ if v.is_nan() => 0,
                b if b >> 31 == 1 => !b,
                b => b | 0x8000_0000,
            };
            let cut = if top_k != 0 && top_k < cols {
                let mut keys: Vec<u32> = row.iter().map(|&v| key(v)).filter(|&k| k != 0).collect();
                keys.sort_unstable_by(|a, b| b.cmp(a));
                keys.get(top_k - 1).copied().unwrap_or(1).max(1)
            } else {
                1
            };
            let mut best: Option<(usize, f32)> = None;
            for (j, &v) in row.iter().enumerate() {
                if key(v) < cut {
                    continue;
                }
                let e = offset + (r * cols + j) as u64;
                let w = crate::rng::philox4(seed, e >> 2)[(e & 3) as usize];
                let u = ((w >> 9) as f64 + 0.5) * (1.0 / 8_388_608.0);
                let s = v / temperature + (-(-u.ln()).ln()) as f32;
                if best.is_none_or(|(_, b)| s > b) {
                    best = Some((j, s));
                }
            }
            best.map_or(0, |(j, _)| j as i32)
        })
        .collect()
}
