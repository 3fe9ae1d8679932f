//! A loss curve as a PNG, with a minimal encoder (stored deflate blocks, CRC-32, Adler-32): no
//! plotting dependency.

use std::path::Path;

use graphed::{Error, Result};

const W: usize = 640;
const H: usize = 360;
const MARGIN: usize = 30;

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for b in bytes {
        c ^= *b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend((data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend(kind);
    out.extend(data);
    let crc = crc32(&out[start..]);
    out.extend(crc.to_be_bytes());
}

/// A zlib stream of stored (uncompressed) deflate blocks.
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = data.chunks(65535).collect();
    for (i, b) in blocks.iter().enumerate() {
        out.push(u8::from(i + 1 == blocks.len()));
        out.extend((b.len() as u16).to_le_bytes());
        out.extend((!(b.len() as u16)).to_le_bytes());
        out.extend(*b);
    }
    let (mut a, mut s) = (1u32, 0u32);
    for v in data {
        a = (a + *v as u32) % 65521;
        s = (s + a) % 65521;
    }
    out.extend(((s << 16) | a).to_be_bytes());
    out
}

/// An RGB image encoded as PNG bytes.
fn png(rgb: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(H * (W * 3 + 1));
    for row in rgb.chunks(W * 3) {
        raw.push(0); // filter: none
        raw.extend(row);
    }
    let mut out = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    let mut ihdr = Vec::new();
    ihdr.extend((W as u32).to_be_bytes());
    ihdr.extend((H as u32).to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib_stored(&raw));
    chunk(&mut out, b"IEND", &[]);
    out
}

fn put(img: &mut [u8], x: usize, y: usize, c: [u8; 3]) {
    if x < W && y < H {
        img[(y * W + x) * 3..][..3].copy_from_slice(&c);
    }
}

/// Draws the polyline of `points` (step, loss) in `color`, scaled to the plot area.
fn polyline(img: &mut [u8], points: &[(usize, f32)], color: [u8; 3], to_px: &dyn Fn(usize, f32) -> (f32, f32)) {
    for pair in points.windows(2) {
        let ((x0, y0), (x1, y1)) = (to_px(pair[0].0, pair[0].1), to_px(pair[1].0, pair[1].1));
        let n = ((x1 - x0).abs().max((y1 - y0).abs()).ceil() as usize).max(1);
        for i in 0..=n {
            let t = i as f32 / n as f32;
            let (x, y) = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t);
            for (dx, dy) in [(0, 0), (1, 0), (0, 1)] {
                put(img, x as usize + dx, y as usize + dy, color);
            }
        }
    }
}

/// Writes the training (blue) and validation (red) losses against the step to `path`, on axes
/// from step 0 and loss 0.
pub fn write_loss_png(path: &Path, train: &[(usize, f32)], val: &[(usize, f32)]) -> Result<()> {
    let mut img = vec![255u8; W * H * 3];
    let all = train.iter().chain(val);
    let max_step = all.clone().map(|p| p.0).max().unwrap_or(1).max(1) as f32;
    let max_loss = all.map(|p| p.1).filter(|l| l.is_finite()).fold(0.0f32, f32::max).max(1e-6);
    let (pw, ph) = ((W - 2 * MARGIN) as f32, (H - 2 * MARGIN) as f32);
    let to_px =
        |s: usize, l: f32| (MARGIN as f32 + pw * s as f32 / max_step, MARGIN as f32 + ph * (1.0 - l / max_loss));
    for x in MARGIN..W - MARGIN {
        put(&mut img, x, H - MARGIN, [0, 0, 0]);
    }
    for y in MARGIN..=H - MARGIN {
        put(&mut img, MARGIN, y, [0, 0, 0]);
    }
    polyline(&mut img, train, [30, 90, 200], &to_px);
    polyline(&mut img, val, [210, 40, 40], &to_px);
    std::fs::write(path, png(&img)).map_err(|e| Error::msg(format!("writing {}: {e}", path.display())))
}
